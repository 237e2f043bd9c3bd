// Line reader over zlib and JSON text-field extraction.
#include "data/jsonl_reader.h"

#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

namespace gale {

namespace {
constexpr size_t kChunk = 1 << 20;
}

StatusOr<std::unique_ptr<JsonlReader>> JsonlReader::open(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) {
    if (errno == ENOENT) return NotFound("--input ", path, ": no such file");
    return IOError("--input ", path, ": cannot open (", std::strerror(errno), ")");
  }
  gzbuffer(f, 1 << 18);
  std::unique_ptr<JsonlReader> r(new JsonlReader());
  r->name_ = path;
  r->gz_ = f;
  return r;
}

std::unique_ptr<JsonlReader> JsonlReader::from_buffer(std::string data, std::string name) {
  std::unique_ptr<JsonlReader> r(new JsonlReader());
  r->name_ = std::move(name);
  r->buffer_ = std::move(data);
  r->eof_ = true;
  return r;
}

JsonlReader::~JsonlReader() {
  if (gz_) gzclose(static_cast<gzFile>(gz_));
}

Status JsonlReader::fill() {
  if (eof_) return Status::Ok();
  buffer_.erase(0, pos_);
  pos_ = 0;
  size_t old = buffer_.size();
  buffer_.resize(old + kChunk);
  int n = gzread(static_cast<gzFile>(gz_), buffer_.data() + old, static_cast<unsigned>(kChunk));
  if (n < 0) {
    int code = 0;
    const char* msg = gzerror(static_cast<gzFile>(gz_), &code);
    buffer_.resize(old);
    return DataLoss(name_, ": read error (", msg ? msg : "unknown", "); is the .gz file truncated?");
  }
  buffer_.resize(old + static_cast<size_t>(n));
  if (n == 0) {
    int code = 0;
    const char* msg = gzerror(static_cast<gzFile>(gz_), &code);
    if (code != Z_OK && code != Z_STREAM_END) return DataLoss(name_, ": read error (", msg ? msg : "unknown", ")");
    eof_ = true;
  }
  return Status::Ok();
}

StatusOr<bool> JsonlReader::next_line(std::string* line) {
  while (true) {
    size_t nl = buffer_.find('\n', pos_);
    if (nl != std::string::npos) {
      line->assign(buffer_, pos_, nl - pos_);
      bytes_read_ += static_cast<int64_t>(nl - pos_ + 1);
      pos_ = nl + 1;
      ++line_number_;
      return true;
    }
    if (eof_) {
      if (pos_ >= buffer_.size()) return false;
      line->assign(buffer_, pos_, std::string::npos);  // last line without '\n'
      bytes_read_ += static_cast<int64_t>(buffer_.size() - pos_);
      pos_ = buffer_.size();
      ++line_number_;
      return true;
    }
    GALE_RETURN_IF_ERROR(fill());
  }
}

bool is_blank_line(std::string_view line) {
  for (char c : line)
    if (c != ' ' && c != '\t' && c != '\r' && c != '\n') return false;
  return true;
}

Status parse_jsonl_texts(std::string_view line, const std::vector<std::string>& keys,
                         std::vector<std::vector<std::string>>* texts) {
  texts->assign(keys.size(), {});
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range for 1e99999
    std::string what = e.what();
    size_t close = what.find("] ");
    if (close != std::string::npos) what = what.substr(close + 2);
    if (what.size() > 200) what = what.substr(0, 200) + "...";
    if (const auto* pe = dynamic_cast<const nlohmann::json::parse_error*>(&e))
      return InvalidArgument("malformed JSON at byte ", pe->byte, ": ", what);
    return InvalidArgument("malformed JSON: ", what);
  }
  if (!j.is_object()) return InvalidArgument("expected a JSON object, found ", j.type_name());
  for (size_t k = 0; k < keys.size(); ++k) {
    auto it = j.find(keys[k]);
    if (it == j.end()) return InvalidArgument("missing key '", keys[k], "' (see --json-keys)");
    if (it->is_string()) {
      (*texts)[k].push_back(it->get<std::string>());
    } else if (it->is_array()) {
      for (const auto& v : *it) {
        if (!v.is_string())
          return InvalidArgument("key '", keys[k], "' holds a list with a ", v.type_name(), ", expected strings only");
        (*texts)[k].push_back(v.get<std::string>());
      }
    } else {
      return InvalidArgument("key '", keys[k], "' is a ", it->type_name(), ", expected a string or a list of strings");
    }
  }
  return Status::Ok();
}

}  // namespace gale
