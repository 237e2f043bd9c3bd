// Character-class lookup (two-stage table built once from the generated runs) and UTF-8 checks.
#include "tokenizer/unicode.h"

#include <array>
#include <map>
#include <vector>

namespace gale {

namespace {
struct Run {
  uint32_t first;
  uint8_t cls;
};
constexpr Run kRuns[] = {
#include "tokenizer/unicode_table.inc"
};

struct ClassTable {
  std::array<uint16_t, 0x1100> stage1{};  // block of 256 code points -> row of stage2
  std::vector<std::array<uint8_t, 256>> stage2;
  ClassTable() {
    std::map<std::array<uint8_t, 256>, uint16_t> rows;
    size_t run = 0;
    constexpr size_t n = sizeof(kRuns) / sizeof(kRuns[0]);
    for (uint32_t block = 0; block < 0x1100; ++block) {
      std::array<uint8_t, 256> row{};
      for (uint32_t k = 0; k < 256; ++k) {
        uint32_t cp = block * 256 + k;
        while (run + 1 < n && kRuns[run + 1].first <= cp) ++run;
        row[k] = kRuns[run].cls;
      }
      auto it = rows.find(row);
      if (it == rows.end()) {
        it = rows.emplace(row, static_cast<uint16_t>(stage2.size())).first;
        stage2.push_back(row);
      }
      stage1[block] = it->second;
    }
  }
};

const ClassTable& table() {
  static const ClassTable t;
  return t;
}
}  // namespace

CharCategory char_category(uint32_t cp) {
  if (cp >= 0x110000) return CharCategory::kOther;
  const ClassTable& t = table();
  return static_cast<CharCategory>(t.stage2[t.stage1[cp >> 8]][cp & 0xFF]);
}

CharClass char_class(uint32_t cp) {
  static constexpr CharClass kCoarse[] = {CharClass::kOther,  CharClass::kLetter, CharClass::kLetter,
                                          CharClass::kLetter, CharClass::kOther,  CharClass::kNumber,
                                          CharClass::kSpace};
  return kCoarse[static_cast<uint8_t>(char_category(cp))];
}

size_t find_invalid_utf8(std::string_view s) {
  const unsigned char* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size(), i = 0;
  while (i < n) {
    unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len;
    uint32_t min;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
      min = 0x80;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      min = 0x10000;
    } else {
      return i;
    }
    if (i + static_cast<size_t>(len) > n) return i;
    for (int k = 1; k < len; ++k)
      if ((p[i + static_cast<size_t>(k)] & 0xC0) != 0x80) return i;
    int l;
    uint32_t cp = decode_utf8(p + i, &l);
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += static_cast<size_t>(len);
  }
  return std::string_view::npos;
}

void append_utf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace gale
