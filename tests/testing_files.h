// File comparisons shared by tests that check what Gale writes (checkpoint directories).
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace gale::testing {

// Every regular file under directory `a` has a file of the same relative path under `b` with the
// same bytes (and there is at least one).
inline void expect_same_files(const std::string& a, const std::string& b) {
  int files = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(a)) {
    if (!e.is_regular_file()) continue;
    const auto rel = std::filesystem::relative(e.path(), a);
    std::ifstream fa(e.path(), std::ios::binary), fb(std::filesystem::path(b) / rel, std::ios::binary);
    ASSERT_TRUE(fb.good()) << rel;
    const std::string sa((std::istreambuf_iterator<char>(fa)), {}), sb((std::istreambuf_iterator<char>(fb)), {});
    EXPECT_TRUE(sa == sb) << rel << " differs";
    ++files;
  }
  EXPECT_GT(files, 0);
}

}  // namespace gale::testing
