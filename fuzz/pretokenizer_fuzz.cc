// libFuzzer target: the hand-written pre-tokenizer matchers and the UTF-8 helpers. The pieces of
// valid UTF-8 text must be non-empty, in order, on character boundaries and cover the text.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/byte_level.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/unicode.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  std::string lossy = gale::utf8_lossy(text);
  if (gale::find_invalid_utf8(lossy) != std::string_view::npos) std::abort();
  if (gale::find_invalid_utf8(text) != std::string_view::npos) return 0;
  if (lossy != text) std::abort();  // valid input passes through unchanged
  std::string raw;
  if (!gale::byte_level_decode(gale::byte_level_encode(text), &raw) || raw != text) std::abort();
  std::vector<uint32_t> ends;
  for (auto p : {gale::SplitPattern::kGpt2, gale::SplitPattern::kLlama3, gale::SplitPattern::kQwen2}) {
    ends.clear();
    gale::pretokenize(p, text, &ends);
    uint32_t prev = 0;
    for (uint32_t e : ends) {
      if (e <= prev || e > size) std::abort();
      if (e < size && (data[e] & 0xC0) == 0x80) std::abort();  // never inside a character
      prev = e;
    }
    if (prev != size) std::abort();
  }
  return 0;
}
