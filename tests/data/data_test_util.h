// Helpers shared by the data-layer tests: temporary directories, fixture files, small datasets.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "data/indexed_dataset.h"

namespace gale::testing {

// A fresh directory under $TMPDIR, removed when the object goes.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "gale-test-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

inline nlohmann::json load_json(const std::string& path) { return nlohmann::json::parse(read_file(path)); }

inline std::string reference_path(const std::string& name) {
  return std::string(GALE_TEST_DATA_DIR) + "/reference/" + name;
}

// Writes PREFIX.bin/.idx with one sequence per document.
inline void write_dataset(const std::string& prefix, const std::vector<std::vector<int32_t>>& docs,
                          TokenDType dtype = TokenDType::kUInt16) {
  auto w = IndexedDatasetWriter::create(prefix, dtype);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  for (const auto& d : docs) {
    std::vector<int32_t> lens;
    if (!d.empty()) lens.push_back(static_cast<int32_t>(d.size()));
    ASSERT_TRUE((*w)->add_document(d, lens).ok());
  }
  ASSERT_TRUE((*w)->finalize().ok());
}

// Writes PREFIX.bin/.idx: 600 documents of 2-9 ids below 99 drawn by std::mt19937(11), each
// followed by the id 99 (NullTokenizer --vocab-size 99's EOD) when `eod`.
inline void write_short_documents(const std::string& prefix, bool eod = true) {
  std::mt19937 rng(11);
  std::vector<std::vector<int32_t>> docs;
  for (int d = 0; d < 600; ++d) {
    std::vector<int32_t> doc(2 + rng() % 8);
    for (int32_t& t : doc) t = static_cast<int32_t>(rng() % 99);
    if (eod) doc.push_back(99);
    docs.push_back(doc);
  }
  write_dataset(prefix, docs);
}

inline std::string hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

}  // namespace gale::testing
