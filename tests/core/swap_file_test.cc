// The anonymous swap file (core/swap_file.h): unlinked at once, reads what was written, zeros where
// nothing was, grows by appends; its errors (a missing directory, a reservation the disk refuses)
// name the flag, the directory and the file.
#include "core/swap_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <numeric>
#include <vector>

namespace gale {
namespace {

std::string fresh_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("gale_swap_file_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

TEST(SwapFile, AnonymousReadsWhatWasWrittenZerosElsewhere) {
  const std::string dir = fresh_dir("file");
  auto f = SwapFile::create(dir, 4096, "--swap-optimizer-dir", "gale-swap-optimizer");
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << "the file must be unlinked at once";
  EXPECT_NE((*f)->path().find(dir), std::string::npos);
  std::vector<float> in(100);
  std::iota(in.begin(), in.end(), 1.0f);
  ASSERT_TRUE((*f)->write(800, in.data(), 400).ok());
  std::vector<float> out(300, -1.0f);
  ASSERT_TRUE((*f)->read(400, out.data(), 1200).ok());
  for (int i = 0; i < 300; ++i) EXPECT_EQ(out[i], i >= 100 && i < 200 ? in[i - 100] : 0.0f) << i;
  std::filesystem::remove_all(dir);
}

TEST(SwapFile, ErrorsNameTheDirectoryAndTheFile) {
  auto missing = SwapFile::create("/nonexistent-gale-swap-dir/sub", 64, "--swap-optimizer-dir", "gale-swap-optimizer");
  ASSERT_FALSE(missing.ok());
  const std::string m = missing.status().message();
  EXPECT_NE(m.find("--swap-optimizer-dir /nonexistent-gale-swap-dir/sub"), std::string::npos) << m;
  EXPECT_NE(m.find("gale-swap-optimizer-"), std::string::npos) << m;
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  // A reservation no disk holds (2^62 bytes).
  const std::string dir = fresh_dir("full");
  auto huge = SwapFile::create(dir, int64_t{1} << 62, "--swap-optimizer-dir", "gale-swap-optimizer");
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.status().message().find("cannot reserve"), std::string::npos) << huge.status().message();
  EXPECT_TRUE(std::filesystem::is_empty(dir));
  std::filesystem::remove_all(dir);
}

TEST(SwapFile, AppendsGrowTheFile) {
  const std::string dir = fresh_dir("append");
  auto f = SwapFile::create(dir, 0, "--swap-attention-dir", "gale-swap-attention");
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_NE((*f)->path().find("gale-swap-attention-"), std::string::npos);
  const std::vector<int32_t> a = {1, 2, 3}, b = {4, 5};
  int64_t at_a = -1, at_b = -1;
  ASSERT_TRUE((*f)->append(a.data(), 12, &at_a).ok());
  ASSERT_TRUE((*f)->append(b.data(), 8, &at_b).ok());
  EXPECT_EQ(at_a, 0);
  EXPECT_EQ(at_b, 12);
  EXPECT_EQ((*f)->size(), 20);
  std::vector<int32_t> all(5);
  ASSERT_TRUE((*f)->read(0, all.data(), 20).ok());
  EXPECT_EQ(all, (std::vector<int32_t>{1, 2, 3, 4, 5}));
  EXPECT_TRUE(std::filesystem::is_empty(dir));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace gale
