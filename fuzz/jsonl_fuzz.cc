// libFuzzer target: the JSON-lines reader and the text-field extraction of `gale preprocess`.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "data/jsonl_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto reader = gale::JsonlReader::from_buffer(std::string(reinterpret_cast<const char*>(data), size), "fuzz.jsonl");
  std::string line;
  std::vector<std::vector<std::string>> texts;
  const std::vector<std::string> keys = {"text", "title"};
  int64_t consumed = 0;
  while (true) {
    auto more = reader->next_line(&line);
    if (!more.ok()) std::abort();  // a memory buffer cannot fail to read
    if (!*more) break;
    consumed += static_cast<int64_t>(line.size());
    if (gale::is_blank_line(line)) continue;
    gale::Status s = gale::parse_jsonl_texts(line, keys, &texts);
    if (s.ok() && texts.size() != keys.size()) std::abort();
  }
  if (consumed > static_cast<int64_t>(size) || reader->bytes_read() != static_cast<int64_t>(size)) std::abort();
  return 0;
}
