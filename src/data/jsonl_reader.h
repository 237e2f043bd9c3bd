// JSON-lines input for `gale preprocess`: a line reader over plain or gzip-compressed files
// (zlib reads both transparently) and the extraction of the text fields of one record.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace gale {

class JsonlReader {
 public:
  // Opens `path` (".gz" or not: the content decides). Errors name the file.
  static StatusOr<std::unique_ptr<JsonlReader>> open(const std::string& path);
  // Reads from memory instead (tests, fuzzing).
  static std::unique_ptr<JsonlReader> from_buffer(std::string data, std::string name = "<memory>");
  ~JsonlReader();

  // The next line without its '\n' (a trailing '\r' is kept: JSON treats it as whitespace).
  // Returns false at the end of the input.
  StatusOr<bool> next_line(std::string* line);
  int64_t line_number() const { return line_number_; }  // 1-based number of the last line returned
  int64_t bytes_read() const { return bytes_read_; }    // uncompressed bytes consumed so far
  const std::string& name() const { return name_; }

 private:
  JsonlReader() = default;
  Status fill();
  std::string name_;
  void* gz_ = nullptr;  // gzFile
  std::string buffer_;
  size_t pos_ = 0;
  bool eof_ = false;
  int64_t line_number_ = 0;
  int64_t bytes_read_ = 0;
};

// The values of `keys` in one JSON line: per key, the list of texts (a string value is a list of
// one). Errors say what is wrong without the file/line (the caller adds them): malformed JSON
// (with the column), a line that is not an object, a missing key, a value that is neither a
// string nor a list of strings, invalid UTF-8.
Status parse_jsonl_texts(std::string_view line, const std::vector<std::string>& keys,
                         std::vector<std::vector<std::string>>* texts);

// True for lines holding only whitespace (skipped by `gale preprocess`).
bool is_blank_line(std::string_view line);

}  // namespace gale
