// libFuzzer target: the tokenizer.json loader, then encode/decode with what loaded.
// Input: a tokenizer.json, optionally followed by "\n@@TEXT@@\n" and a text to encode.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "tokenizer/hf_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  std::string_view json = input, text = "Hello <s> world\n\t12345 caf\xC3\xA9 \xF0\x9F\xA6\x80";
  size_t sep = input.find("\n@@TEXT@@\n");
  if (sep != std::string_view::npos) {
    json = input.substr(0, sep);
    text = input.substr(sep + 10);
  }
  auto t = gale::HuggingFaceTokenizer::parse(json, "", "fuzz.json");
  if (!t.ok()) return 0;
  std::vector<int32_t> ids;
  gale::Status s = (*t)->encode(text, &ids);
  if (!s.ok()) return 0;  // invalid UTF-8 text
  for (int32_t id : ids)
    if (id < 0) std::abort();
  auto d = (*t)->decode(ids);
  (void)d;
  return 0;
}
