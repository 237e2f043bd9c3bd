// GPT-2 / Llama-3 / Qwen2 / tiktoken v1 and v2 pre-tokenization without a regex engine.
#include "tokenizer/pretokenizer.h"

#include <string>
#include <vector>

#include "tokenizer/unicode.h"

namespace gale {

namespace {

struct Cursor {
  const unsigned char* p;
  size_t n;
  // Class and byte length of the code point at i (i < n).
  CharClass cls(size_t i, int* len) const {
    unsigned char c = p[i];
    if (c < 0x80) {
      *len = 1;
      return kAscii[c];
    }
    uint32_t cp = decode_utf8(p + i, len);
    return char_class(cp);
  }
  static constexpr CharClass ascii_class(unsigned c) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return CharClass::kLetter;
    if (c >= '0' && c <= '9') return CharClass::kNumber;
    if (c == ' ' || (c >= '\t' && c <= '\r')) return CharClass::kSpace;
    return CharClass::kOther;
  }
  static const CharClass kAscii[128];
  // End of the run of characters of class `c` starting at i (at most `max_chars` characters).
  size_t run(size_t i, CharClass c, size_t max_chars = SIZE_MAX) const {
    size_t count = 0;
    while (i < n && count < max_chars) {
      int len;
      if (cls(i, &len) != c) break;
      i += static_cast<size_t>(len);
      ++count;
    }
    return i;
  }
};

constexpr CharClass make(unsigned c) { return Cursor::ascii_class(c); }
const CharClass Cursor::kAscii[128] = {
#define R8(b) make(b), make(b + 1), make(b + 2), make(b + 3), make(b + 4), make(b + 5), make(b + 6), make(b + 7)
    R8(0),  R8(8),  R8(16), R8(24), R8(32),  R8(40),  R8(48), R8(56), R8(64),
    R8(72), R8(80), R8(88), R8(96), R8(104), R8(112), R8(120)
#undef R8
};

inline bool is_newline(unsigned char c) { return c == '\r' || c == '\n'; }

// Length of the contraction after the apostrophe at i ('s 't 're 've 'm 'll 'd), 0 if none.
size_t contraction(const Cursor& t, size_t i, bool ignore_case) {
  size_t j = i + 1;
  auto at = [&](size_t k) -> int {
    if (k >= t.n) return -1;
    int c = t.p[k];
    return ignore_case && c >= 'A' && c <= 'Z' ? c + 32 : c;
  };
  int a = at(j);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (ignore_case && j + 1 < t.n && t.p[j] == 0xC5 && t.p[j + 1] == 0xBF) return 3;  // U+017F folds to 's'
  int b = at(j + 1);
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

// The shared tail of both patterns: \s+(?!\S)|\s+ for the whitespace run starting at i.
size_t whitespace_piece(const Cursor& t, size_t i) {
  size_t end = i, last = i;
  int len;
  while (end < t.n && t.cls(end, &len) == CharClass::kSpace) {
    last = end;
    end += static_cast<size_t>(len);
  }
  if (end == t.n) return end;  // run reaches the end of the text
  if (last > i) return last;   // leave the last space to attach to what follows
  return end;                  // a single space before non-space
}

void split_gpt2(const Cursor& t, std::vector<uint32_t>* ends) {
  size_t i = 0;
  while (i < t.n) {
    size_t end;
    int len;
    if (t.p[i] == '\'' && (end = contraction(t, i, false)) != 0) {
      end += i;
    } else {
      CharClass c0 = t.cls(i, &len);
      if (t.p[i] == ' ' && i + 1 < t.n) {
        int len1;
        CharClass c1 = t.cls(i + 1, &len1);
        if (c1 != CharClass::kSpace) {
          end = t.run(i + 1, c1);
          ends->push_back(static_cast<uint32_t>(end));
          i = end;
          continue;
        }
      }
      end = c0 == CharClass::kSpace ? whitespace_piece(t, i) : t.run(i, c0);
    }
    ends->push_back(static_cast<uint32_t>(end));
    i = end;
  }
}

// The whitespace alternatives of the cl100k-style patterns: \s*[\r\n]+ takes the run up to its last
// newline, if it has one; else \s+(?!\S)|\s+.
size_t newline_or_whitespace_piece(const Cursor& t, size_t i) {
  size_t run_end = i, after_newline = 0;
  int len;
  while (run_end < t.n && t.cls(run_end, &len) == CharClass::kSpace) {
    if (is_newline(t.p[run_end])) after_newline = run_end + 1;
    run_end += static_cast<size_t>(len);
  }
  return after_newline ? after_newline : whitespace_piece(t, i);
}

void split_cl100k(const Cursor& t, size_t max_digits, bool contractions, std::vector<uint32_t>* ends) {
  size_t i = 0;
  while (i < t.n) {
    size_t end = 0;
    int len;
    unsigned char c = t.p[i];
    CharClass c0 = t.cls(i, &len);
    if (contractions && c == '\'' && (end = contraction(t, i, true)) != 0) {
      end += i;
    } else if (c0 == CharClass::kLetter) {
      end = t.run(i, CharClass::kLetter);
    } else if (c0 != CharClass::kNumber && !is_newline(c) && i + static_cast<size_t>(len) < t.n && [&] {
                 int l1;
                 return t.cls(i + static_cast<size_t>(len), &l1) == CharClass::kLetter;
               }()) {
      end = t.run(i + static_cast<size_t>(len), CharClass::kLetter);  // [^\r\n\p{L}\p{N}]?\p{L}+
    } else if (c0 == CharClass::kNumber) {
      end = t.run(i, CharClass::kNumber, max_digits);
    } else if (c0 == CharClass::kOther || (c == ' ' && i + 1 < t.n && [&] {
                 int l1;
                 return t.cls(i + 1, &l1) == CharClass::kOther;
               }())) {
      end = t.run(c0 == CharClass::kOther ? i : i + 1, CharClass::kOther);  //  ?[^\s\p{L}\p{N}]+[\r\n]*
      while (end < t.n && is_newline(t.p[end])) ++end;
    } else {
      end = newline_or_whitespace_piece(t, i);
    }
    ends->push_back(static_cast<uint32_t>(end));
    i = end;
  }
}

// Tiktoken's v2 pattern needs the letters by case and the marks.
struct CategoryCursor {
  const Cursor& t;
  CharCategory at(size_t i, int* len) const {
    unsigned char c = t.p[i];
    if (c < 0x80) {
      *len = 1;
      if (c >= 'A' && c <= 'Z') return CharCategory::kUpper;
      if (c >= 'a' && c <= 'z') return CharCategory::kLower;
      if (c >= '0' && c <= '9') return CharCategory::kNumber;
      if (c == ' ' || (c >= '\t' && c <= '\r')) return CharCategory::kSpace;
      return CharCategory::kOther;
    }
    return char_category(decode_utf8(t.p + i, len));
  }
  static bool upper(CharCategory c) {  // U = [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]
    return c == CharCategory::kUpper || c == CharCategory::kOtherLetter || c == CharCategory::kMark;
  }
  static bool lower(CharCategory c) {  // L = [\p{Ll}\p{Lm}\p{Lo}\p{M}]
    return c == CharCategory::kLower || c == CharCategory::kOtherLetter || c == CharCategory::kMark;
  }
  static bool letter(CharCategory c) {
    return c == CharCategory::kUpper || c == CharCategory::kLower || c == CharCategory::kOtherLetter;
  }
  // P = [^\r\n\p{L}\p{N}]
  bool prefix(size_t i, CharCategory c) const { return !is_newline(t.p[i]) && !letter(c) && c != CharCategory::kNumber; }
  // End of the run of characters satisfying `in` from i.
  template <typename In>
  size_t run(size_t i, In in) const {
    int len;
    while (i < t.n && in(at(i, &len))) i += static_cast<size_t>(len);
    return i;
  }
};

// P?U*L+ at i, as a backtracking engine matches it: P taken first; U* greedy, giving back one
// character at a time until L+ can start. 0 when it does not match.
size_t match_upper_star_lower_plus(const CategoryCursor& c, size_t i) {
  int len;
  CharCategory c0 = c.at(i, &len);
  static thread_local std::vector<size_t> starts;  // the U run's character starts, then its end
  for (size_t pos : {c.prefix(i, c0) ? i + static_cast<size_t>(len) : SIZE_MAX, i}) {
    if (pos == SIZE_MAX) continue;
    starts.clear();
    size_t q = pos;
    for (;;) {
      starts.push_back(q);
      if (q >= c.t.n) break;
      CharCategory cq = c.at(q, &len);
      if (!CategoryCursor::upper(cq)) break;
      q += static_cast<size_t>(len);
    }
    for (size_t k = starts.size(); k-- > 0;) {
      size_t s = starts[k];
      if (s < c.t.n && CategoryCursor::lower(c.at(s, &len))) return c.run(s, CategoryCursor::lower);
    }
  }
  return 0;
}

// P?U+L* at i; 0 when it does not match.
size_t match_upper_plus_lower_star(const CategoryCursor& c, size_t i) {
  int len;
  CharCategory c0 = c.at(i, &len);
  for (size_t pos : {c.prefix(i, c0) ? i + static_cast<size_t>(len) : SIZE_MAX, i}) {
    if (pos == SIZE_MAX || pos >= c.t.n || !CategoryCursor::upper(c.at(pos, &len))) continue;
    return c.run(c.run(pos, CategoryCursor::upper), CategoryCursor::lower);
  }
  return 0;
}

void split_tiktoken_v2(const Cursor& t, std::vector<uint32_t>* ends) {
  CategoryCursor c{t};
  auto symbol = [](CharCategory k) {  // [^\s\p{L}\p{N}]
    return k != CharCategory::kSpace && k != CharCategory::kNumber && !CategoryCursor::letter(k);
  };
  size_t i = 0;
  while (i < t.n) {
    int len;
    CharCategory c0 = c.at(i, &len);
    size_t end = match_upper_star_lower_plus(c, i);
    if (end == 0) end = match_upper_plus_lower_star(c, i);
    if (end == 0 && c0 == CharCategory::kNumber) end = i + static_cast<size_t>(len);
    if (end == 0) {
      size_t from = symbol(c0) ? i : SIZE_MAX;
      int l1;
      if (from == SIZE_MAX && t.p[i] == ' ' && i + 1 < t.n && symbol(c.at(i + 1, &l1))) from = i + 1;
      if (from != SIZE_MAX) {  //  ?[^\s\p{L}\p{N}]+[\r\n/]*
        end = c.run(from, symbol);
        while (end < t.n && (is_newline(t.p[end]) || t.p[end] == '/')) ++end;
      }
    }
    if (end == 0) end = newline_or_whitespace_piece(t, i);
    ends->push_back(static_cast<uint32_t>(end));
    i = end;
  }
}

}  // namespace

void pretokenize(SplitPattern pattern, std::string_view text, std::vector<uint32_t>* ends) {
  Cursor t{reinterpret_cast<const unsigned char*>(text.data()), text.size()};
  switch (pattern) {
    case SplitPattern::kGpt2:
      split_gpt2(t, ends);
      break;
    case SplitPattern::kLlama3:
      split_cl100k(t, 3, /*contractions=*/true, ends);
      break;
    case SplitPattern::kQwen2:
      split_cl100k(t, 1, /*contractions=*/true, ends);
      break;
    case SplitPattern::kTiktokenV1:
      split_cl100k(t, 1, /*contractions=*/false, ends);
      break;
    case SplitPattern::kTiktokenV2:
      split_tiktoken_v2(t, ends);
      break;
  }
}

std::optional<SplitPattern> recognize_split_pattern(std::string_view regex) {
  static const std::string kGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
  static const std::string kGpt2Tiktoken = R"('(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
  static const std::string kLlama3 =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  static const std::string kQwen2 =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  static const std::string kCl100k =
      R"('(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)";
  if (regex == kGpt2 || regex == kGpt2Tiktoken) return SplitPattern::kGpt2;
  if (regex == kLlama3 || regex == kCl100k) return SplitPattern::kLlama3;
  if (regex == kQwen2) return SplitPattern::kQwen2;
  return std::nullopt;
}

}  // namespace gale
