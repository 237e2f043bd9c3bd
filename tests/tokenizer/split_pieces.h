// Test helper: the pieces pretokenize() cuts a text into, as strings.
#pragma once

#include <string>
#include <vector>

#include "tokenizer/pretokenizer.h"

namespace gale {

inline std::vector<std::string> split(SplitPattern p, const std::string& text) {
  std::vector<uint32_t> ends;
  pretokenize(p, text, &ends);
  std::vector<std::string> out;
  uint32_t start = 0;
  for (uint32_t e : ends) {
    out.push_back(text.substr(start, e - start));
    start = e;
  }
  return out;
}

}  // namespace gale
