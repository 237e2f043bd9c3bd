// libFuzzer target: the hand-written pre-tokenizer matchers, the Punkt sentence splitter and the
// UTF-8 helpers. The pieces of valid UTF-8 text must be non-empty, in order, on character
// boundaries and cover the text; sentences must lie inside the text.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/byte_level.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/punkt.h"
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
  static const gale::PunktParameters params = [] {
    gale::PunktParameters p;
    p.abbrev_types = {"mr", "e.g", "st"};
    p.collocations = {{"##number##", "chapter"}, {"st", "james"}};
    p.sent_starters = {"the", "but"};
    p.ortho_context = {{"the", 2 | 16}, {"smith", 4}, {"james", 2}};
    return p;
  }();
  size_t code_points = 0;
  for (size_t i = 0; i < size; ++i) code_points += (data[i] & 0xC0) != 0x80;
  for (bool keep_newlines : {false, true}) {
    const gale::PunktSentenceSplitter splitter(params, keep_newlines);
    for (const auto& [b, e] : splitter.span_tokenize(text))
      if (b > code_points || e > code_points) std::abort();
    for (std::string_view s : splitter.split(text))
      if (!s.empty() && (s.data() < text.data() || s.data() + s.size() > text.data() + size)) std::abort();
  }
  return 0;
}
