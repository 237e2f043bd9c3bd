// NLTK's Punkt sentence splitter: word tokens, the two annotation passes and the sentence spans.
#include "tokenizer/punkt.h"

#include <unicode/uchar.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <sys/stat.h>

#include "tokenizer/unicode.h"
#include "tokenizer/unicode_normalize.h"

namespace gale {
namespace {

// NLTK's orthographic context flags: the type seen upper/lower case at the beginning of a
// sentence, in the middle, or where it could not tell.
constexpr int kBegUc = 1 << 1, kMidUc = 1 << 2, kUnkUc = 1 << 3;
constexpr int kBegLc = 1 << 4, kMidLc = 1 << 5, kUnkLc = 1 << 6;
constexpr int kOrthoUc = kBegUc | kMidUc | kUnkUc;
constexpr int kOrthoLc = kBegLc | kMidLc | kUnkLc;

// Python's str.isspace (what `\s` matches in a str pattern).
bool py_space(uint32_t c) {
  if (c <= 0x20) return c == 0x20 || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F);
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}
// Python's string.whitespace (NLTK's _get_last_whitespace_index).
bool ascii_whitespace(uint32_t c) { return c == ' ' || (c >= 0x09 && c <= 0x0D); }
bool py_decimal(uint32_t c) { return u_charType(static_cast<UChar32>(c)) == U_DECIMAL_DIGIT_NUMBER; }
// `\w`: Python's isalnum (a letter, or any character with a numeric value) or '_'.
bool py_word(uint32_t c) {
  if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  const int8_t t = u_charType(static_cast<UChar32>(c));
  if (t == U_UPPERCASE_LETTER || t == U_LOWERCASE_LETTER || t == U_TITLECASE_LETTER || t == U_MODIFIER_LETTER ||
      t == U_OTHER_LETTER)
    return true;
  return u_getIntPropertyValue(static_cast<UChar32>(c), UCHAR_NUMERIC_TYPE) != U_NT_NONE;
}
bool nondigit_word(uint32_t c) { return py_word(c) && !py_decimal(c); }  // [^\W\d]
bool py_upper(uint32_t c) { return u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_UPPERCASE); }
bool py_lower(uint32_t c) { return u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_LOWERCASE); }
bool sent_end_char(uint32_t c) { return c == '.' || c == '?' || c == '!'; }
bool in_set(uint32_t c, const char* set) { return c < 0x80 && c != 0 && std::strchr(set, static_cast<int>(c)); }
// Characters that cannot appear within words (NLTK's _re_non_word_chars with ? and !).
bool non_word(uint32_t c) { return in_set(c, ")\";}]*:@'({[!?"); }
// Characters that cannot start a word token (NLTK's _re_word_start excludes them).
bool bad_word_start(uint32_t c) { return in_set(c, "(\"`{[:;&#*@)}]-,"); }

using Cps = std::vector<uint32_t>;

std::string utf8_of(const Cps& cps, size_t begin, size_t end) {
  std::string s;
  for (size_t i = begin; i < end; ++i) append_utf8(cps[i], &s);
  return s;
}

// Python's str.lower() of cps[begin, end).
std::string lower_of(const Cps& cps, size_t begin, size_t end) {
  std::string s = utf8_of(cps, begin, end);
  bool ascii = true;
  for (char& ch : s) {
    if (static_cast<unsigned char>(ch) >= 0x80) ascii = false;
    if (ch >= 'A' && ch <= 'Z') ch = static_cast<char>(ch - 'A' + 'a');
  }
  if (!ascii) (void)unicode_lowercase(&s);  // valid UTF-8 in, so it cannot fail
  return s;
}

// NLTK's _RE_NUMERIC, ^-?[\.,]?\d[\d,\.-]*\.?$, on a lowercased token.
bool numeric_type(const std::string& s) {
  Cps cps;
  for (size_t i = 0; i < s.size();) {
    int len = 0;
    cps.push_back(decode_utf8(reinterpret_cast<const unsigned char*>(s.data()) + i, &len));
    i += static_cast<size_t>(len);
  }
  size_t i = 0;
  if (i < cps.size() && cps[i] == '-') ++i;
  if (i < cps.size() && (cps[i] == '.' || cps[i] == ',')) ++i;
  if (i >= cps.size() || !py_decimal(cps[i])) return false;
  for (++i; i < cps.size(); ++i)
    if (!py_decimal(cps[i]) && cps[i] != ',' && cps[i] != '.' && cps[i] != '-') return false;
  return true;
}

// Multi-character punctuation starting at i in [.., end): --+, ..+ or ". . ." (NLTK's
// _re_multi_char_punct, alternatives in its order). Returns its length, 0 when there is none.
size_t multi_char_len(const Cps& s, size_t i, size_t end) {
  if (i + 1 >= end) return 0;
  for (uint32_t c : {uint32_t{'-'}, uint32_t{'.'}}) {
    if (s[i] == c && s[i + 1] == c) {
      size_t j = i;
      while (j < end && s[j] == c) ++j;
      return j - i;
    }
  }
  // (?:\.\s){2,}\. : as many ". " pairs as there are, then a period (one pair fewer if needed).
  size_t pairs = 0;
  while (i + 2 * pairs + 1 < end && s[i + 2 * pairs] == '.' && py_space(s[i + 2 * pairs + 1])) ++pairs;
  if (pairs >= 2 && i + 2 * pairs < end && s[i + 2 * pairs] == '.') return 2 * pairs + 1;
  if (pairs >= 3) return 2 * pairs - 1;
  return 0;
}

// Where a word token may end: before whitespace, the end, punctuation or a word-final comma.
bool word_end_at(const Cps& s, size_t j, size_t end) {
  if (j >= end || py_space(s[j]) || non_word(s[j]) || multi_char_len(s, j, end) > 0) return true;
  if (s[j] != ',') return false;
  return j + 1 >= end || py_space(s[j + 1]) || non_word(s[j + 1]) || multi_char_len(s, j + 1, end) > 0;
}

struct Token {
  size_t begin = 0, end = 0;  // code points of the text being annotated
  std::string type;           // lowercased, "##number##" for numbers
  bool period_final = false;
  bool sentbreak = false, abbr = false, ellipsis = false;

  std::string type_no_period() const {
    return type.size() > 1 && type.back() == '.' ? type.substr(0, type.size() - 1) : type;
  }
  std::string type_no_sentperiod() const { return sentbreak ? type_no_period() : type; }
};

// The word tokens of s[begin, end), line by line (NLTK's _tokenize_words and word_tokenize).
std::vector<Token> tokenize_words(const Cps& s, size_t begin, size_t end) {
  std::vector<Token> tokens;
  size_t line_begin = begin;
  while (line_begin <= end) {
    size_t line_end = line_begin;
    while (line_end < end && s[line_end] != '\n') ++line_end;
    for (size_t i = line_begin; i < line_end;) {
      size_t j;
      if (py_space(s[i])) {
        ++i;
        continue;
      }
      if (size_t m = multi_char_len(s, i, line_end); m > 0) {
        j = i + m;
      } else if (!bad_word_start(s[i])) {
        j = i + 1;
        while (!word_end_at(s, j, line_end)) ++j;
      } else {
        j = i + 1;
      }
      Token t;
      t.begin = i;
      t.end = j;
      t.type = lower_of(s, i, j);
      if (numeric_type(t.type)) t.type = "##number##";
      t.period_final = s[j - 1] == '.';
      tokens.push_back(std::move(t));
      i = j;
    }
    line_begin = line_end + 1;
  }
  return tokens;
}

class Annotator {
 public:
  Annotator(const PunktParameters& p, const Cps& s) : p_(p), s_(s) {}

  // NLTK's text_contains_sentbreak: a break on any token but the last.
  bool contains_sentbreak(size_t begin, size_t end) const {
    std::vector<Token> tokens = tokenize_words(s_, begin, end);
    for (Token& t : tokens) first_pass(&t);
    for (size_t i = 0; i + 1 < tokens.size(); ++i) {
      second_pass(&tokens[i], tokens[i + 1]);
      if (tokens[i].sentbreak) return true;
    }
    return false;
  }

 private:
  size_t length(const Token& t) const { return t.end - t.begin; }
  bool is_one_of(const Token& t, const char* set) const { return length(t) == 1 && in_set(s_[t.begin], set); }
  bool first_upper(const Token& t) const { return py_upper(s_[t.begin]); }
  bool first_lower(const Token& t) const { return py_lower(s_[t.begin]); }
  bool is_initial(const Token& t) const {
    return length(t) == 2 && nondigit_word(s_[t.begin]) && s_[t.begin + 1] == '.';
  }
  bool is_ellipsis(const Token& t) const {
    if (length(t) < 2) return false;
    for (size_t i = t.begin; i < t.end; ++i)
      if (s_[i] != '.') return false;
    return true;
  }
  int ortho(const std::string& type) const {
    auto it = p_.ortho_context.find(type);
    return it == p_.ortho_context.end() ? 0 : it->second;
  }

  void first_pass(Token* t) const {
    if (is_one_of(*t, ".?!")) {
      t->sentbreak = true;
    } else if (is_ellipsis(*t)) {
      t->ellipsis = true;
    } else if (t->period_final && !(length(*t) >= 2 && s_[t->end - 2] == '.')) {
      std::string stem = lower_of(s_, t->begin, t->end - 1);
      size_t dash = stem.rfind('-');
      if (p_.abbrev_types.count(stem) || (dash != std::string::npos && p_.abbrev_types.count(stem.substr(dash + 1))))
        t->abbr = true;
      else
        t->sentbreak = true;
    }
  }

  // NLTK's _ortho_heuristic: does `t` start a sentence? true, false or (nullopt) unknown.
  std::optional<bool> starts_sentence(const Token& t) const {
    if (is_one_of(t, ";:,.!?")) return false;
    const int context = ortho(t.type_no_sentperiod());
    if (first_upper(t) && (context & kOrthoLc) && !(context & kMidUc)) return true;
    if (first_lower(t) && ((context & kOrthoUc) || !(context & kBegLc))) return false;
    return std::nullopt;
  }

  void second_pass(Token* t, const Token& next) const {
    if (!t->period_final) return;
    const std::string type = t->type_no_period();
    const std::string next_type = next.type_no_sentperiod();
    const bool initial = is_initial(*t);
    if (p_.collocations.count({type, next_type})) {  // collocation heuristic
      t->sentbreak = false;
      t->abbr = true;
      return;
    }
    if ((t->abbr || t->ellipsis) && !initial) {  // an abbreviation that also ends a sentence?
      if (starts_sentence(next) == std::optional<bool>(true)) {
        t->sentbreak = true;
        return;
      }
      if (first_upper(next) && p_.sent_starters.count(next_type)) {
        t->sentbreak = true;
        return;
      }
    }
    if (initial || type == "##number##") {  // initials and ordinals
      const std::optional<bool> starter = starts_sentence(next);
      if (starter == std::optional<bool>(false)) {
        t->sentbreak = false;
        t->abbr = true;
        return;
      }
      if (!starter.has_value() && initial && first_upper(next) && !(ortho(next_type) & kOrthoLc)) {
        t->sentbreak = false;
        t->abbr = true;
      }
    }
  }

  const PunktParameters& p_;
  const Cps& s_;
};

// One candidate sentence end (a match of NLTK's period-context pattern).
struct Candidate {
  size_t start = 0, end = 0;        // the match
  size_t after_end = 0;             // end of the after_tok group (it starts at `end`)
  std::optional<size_t> next_tok;   // start of the next_tok group
};

// The standard pattern: one sentence-end character followed by other punctuation, or by
// whitespace and a token.
std::vector<Candidate> standard_candidates(const Cps& s) {
  std::vector<Candidate> out;
  const size_t n = s.size();
  for (size_t p = 0; p < n; ++p) {
    if (!sent_end_char(s[p])) continue;
    if (p + 1 < n && non_word(s[p + 1])) {
      out.push_back({p, p + 1, p + 2, std::nullopt});
      continue;
    }
    size_t q = p + 1;
    while (q < n && py_space(s[q])) ++q;
    if (q == p + 1 || q >= n) continue;
    size_t r = q;
    while (r < n && !py_space(s[r])) ++r;
    out.push_back({p, p + 1, r, q});
  }
  return out;
}

// Megatron's CustomLanguageVars pattern, \S*[.?!]\s*(?=(NonWord|\S+)): the word before the end
// and the whitespace after it belong to the match; greedy, so the last workable end in the word.
std::vector<Candidate> keep_newlines_candidates(const Cps& s) {
  std::vector<Candidate> out;
  const size_t n = s.size();
  size_t p = 0;
  while (p < n) {
    if (py_space(s[p])) {
      ++p;
      continue;
    }
    size_t r = p;
    while (r < n && !py_space(s[r])) ++r;
    std::optional<Candidate> found;
    for (size_t q = r; q-- > p;) {
      if (!sent_end_char(s[q])) continue;
      size_t w = q + 1;
      if (w == r) {
        while (w < n && py_space(s[w])) ++w;
        if (w >= n) continue;  // nothing but whitespace after it
      }
      Candidate c{p, w, 0, std::nullopt};
      if (non_word(s[w])) {
        c.after_end = w + 1;
      } else {
        size_t e = w;
        while (e < n && !py_space(s[e])) ++e;
        c.after_end = e;
        c.next_tok = w;
      }
      found = c;
      break;
    }
    if (!found) {
      p = r;
      continue;
    }
    out.push_back(*found);
    p = found->end;
  }
  return out;
}

// NLTK's _match_potential_end_contexts: each candidate with its context, the word before it
// (found by whitespace, NLTK's quirks kept) up to the end of the token after it. A candidate whose
// word overlaps the previous candidate's is dropped.
std::vector<std::pair<Candidate, std::pair<size_t, size_t>>> end_contexts(const Cps& s,
                                                                           const std::vector<Candidate>& matches) {
  std::vector<std::pair<Candidate, std::pair<size_t, size_t>>> out;
  size_t prev_start = 0, prev_stop = 0;
  std::optional<Candidate> prev;
  for (const Candidate& m : matches) {
    size_t last_ws = 0;  // index in s[prev_stop, m.start) of its last whitespace; 0 when none (or at 0)
    for (size_t i = m.start; i-- > prev_stop;) {
      if (ascii_whitespace(s[i])) {
        last_ws = i - prev_stop;
        break;
      }
    }
    const size_t word_start = last_ws ? prev_stop + last_ws + 1 : prev_start;
    if (prev && prev_stop <= word_start) out.push_back({*prev, {prev_start, prev->after_end}});
    prev = m;
    prev_start = word_start;
    prev_stop = m.start;
  }
  if (prev) out.push_back({*prev, {prev_start, prev->after_end}});
  return out;
}

// NLTK's re_boundary_realignment, ["')\]}]+?(?:\s+|(?=--)|$) with MULTILINE, matched at the start
// of s[begin, end): the number of closing characters it takes, and the match's end.
std::optional<std::pair<size_t, size_t>> realignment(const Cps& s, size_t begin, size_t end) {
  for (size_t k = begin; k < end && in_set(s[k], "\"')]}"); ++k) {
    const size_t after = k + 1;
    if (after < end && py_space(s[after])) {
      size_t w = after;
      while (w < end && py_space(s[w])) ++w;
      return std::make_pair(after - begin, w - begin);
    }
    if ((after + 1 < end && s[after] == '-' && s[after + 1] == '-') || after == end || s[after] == '\n')
      return std::make_pair(after - begin, after - begin);
  }
  return std::nullopt;
}

}  // namespace

PunktSentenceSplitter::PunktSentenceSplitter(PunktParameters params, bool keep_newlines)
    : params_(std::move(params)), keep_newlines_(keep_newlines) {}

std::vector<std::pair<size_t, size_t>> PunktSentenceSplitter::span_tokenize(std::string_view text) const {
  Cps s;
  s.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    int len = 0;
    s.push_back(decode_utf8(reinterpret_cast<const unsigned char*>(text.data()) + i, &len));
    i += static_cast<size_t>(len);
  }
  // _slices_from_text
  Annotator annotator(params_, s);
  std::vector<std::pair<size_t, size_t>> slices;
  size_t last_break = 0;
  const auto matches = keep_newlines_ ? keep_newlines_candidates(s) : standard_candidates(s);
  for (const auto& [m, context] : end_contexts(s, matches)) {
    if (!annotator.contains_sentbreak(context.first, context.second)) continue;
    slices.push_back({last_break, m.end});
    last_break = m.next_tok ? *m.next_tok : m.end;
  }
  size_t stripped = s.size();
  while (stripped > 0 && py_space(s[stripped - 1])) --stripped;
  slices.push_back({last_break, stripped});

  // _realign_boundaries
  std::vector<std::pair<size_t, size_t>> spans;
  size_t realign = 0;
  for (size_t i = 0; i < slices.size(); ++i) {
    const size_t start = slices[i].first + realign, stop = slices[i].second;
    const bool nonempty = start < stop;
    if (i + 1 == slices.size()) {
      if (nonempty) spans.push_back({start, stop});
      continue;
    }
    const auto& next = slices[i + 1];
    if (auto m = realignment(s, next.first, next.second)) {
      spans.push_back({start, next.first + m->first});
      realign = m->second;
    } else {
      realign = 0;
      if (nonempty) spans.push_back({start, stop});
    }
  }
  return spans;
}

std::vector<std::string_view> PunktSentenceSplitter::split(std::string_view text) const {
  std::vector<size_t> offsets;  // byte offset of each code point, and of the end
  for (size_t i = 0; i < text.size(); i += static_cast<size_t>(utf8_length(static_cast<unsigned char>(text[i]))))
    offsets.push_back(i);
  offsets.push_back(text.size());
  std::vector<std::string_view> out;
  for (const auto& [b, e] : span_tokenize(text)) {
    if (b >= e) {
      out.emplace_back();
      continue;
    }
    out.push_back(text.substr(offsets[b], offsets[e] - offsets[b]));
  }
  return out;
}

namespace {

// The lines of a punkt_tab file, each without its final '\n' (NLTK's rm_nl).
StatusOr<std::vector<std::string>> read_lines(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("--split-sentences: cannot open the Punkt parameter file ", path);
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    if (find_invalid_utf8(line) != std::string_view::npos)
      return InvalidArgument(path, ":", lines.size() + 1, ": expected UTF-8 text");
    lines.push_back(line);
  }
  return lines;
}

bool is_dir(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
bool is_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace

StatusOr<PunktParameters> load_punkt_tab(const std::string& dir) {
  PunktParameters p;
  GALE_ASSIGN_OR_RETURN(auto abbrevs, read_lines(dir + "/abbrev_types.txt"));
  p.abbrev_types.insert(abbrevs.begin(), abbrevs.end());
  GALE_ASSIGN_OR_RETURN(auto starters, read_lines(dir + "/sent_starters.txt"));
  p.sent_starters.insert(starters.begin(), starters.end());
  const std::string colloc_path = dir + "/collocations.tab";
  GALE_ASSIGN_OR_RETURN(auto collocs, read_lines(colloc_path));
  for (size_t i = 0; i < collocs.size(); ++i) {
    size_t tab = collocs[i].find('\t');
    if (tab == std::string::npos || collocs[i].find('\t', tab + 1) != std::string::npos)
      return InvalidArgument(colloc_path, ":", i + 1, ": expected two types separated by one tab, found '",
                             collocs[i], "'");
    p.collocations.insert({collocs[i].substr(0, tab), collocs[i].substr(tab + 1)});
  }
  const std::string ortho_path = dir + "/ortho_context.tab";
  GALE_ASSIGN_OR_RETURN(auto ortho, read_lines(ortho_path));
  for (size_t i = 0; i < ortho.size(); ++i) {
    size_t tab = ortho[i].find('\t');
    const char* digits = tab == std::string::npos ? nullptr : ortho[i].c_str() + tab + 1;
    char* endp = nullptr;
    long value = digits && *digits ? std::strtol(digits, &endp, 10) : -1;
    if (!digits || !*digits || *endp != '\0' || value < 0 || value > 0x7F)
      return InvalidArgument(ortho_path, ":", i + 1, ": expected a type, a tab and flags 0..127, found '", ortho[i],
                             "'");
    p.ortho_context[ortho[i].substr(0, tab)] = static_cast<int>(value);
  }
  return p;
}

StatusOr<std::string> find_punkt_tab(const std::string& lang) {
  std::vector<std::string> roots;
  if (const char* env = std::getenv("NLTK_DATA")) {
    std::string v = env;
    for (size_t b = 0; b <= v.size();) {
      size_t e = v.find(':', b);
      if (e == std::string::npos) e = v.size();
      if (e > b) roots.push_back(v.substr(b, e - b));
      b = e + 1;
    }
  }
  if (const char* home = std::getenv("HOME")) roots.push_back(std::string(home) + "/nltk_data");
  for (const char* d : {"/usr/share/nltk_data", "/usr/local/share/nltk_data", "/usr/lib/nltk_data",
                        "/usr/local/lib/nltk_data"})
    roots.push_back(d);
  std::string searched, pickle;
  for (const std::string& root : roots) {
    const std::string dir = root + "/tokenizers/punkt_tab/" + lang;
    if (is_dir(dir)) return dir;
    searched += (searched.empty() ? "" : ", ") + root;
    const std::string p = root + "/tokenizers/punkt/PY3/" + lang + ".pickle";
    if (pickle.empty() && is_file(p)) pickle = p;
  }
  std::string msg = str_cat("--split-sentences: no Punkt parameters for --lang ", lang, ": expected tokenizers/punkt_tab/",
                            lang, "/ in one of the NLTK data directories ($NLTK_DATA, then NLTK's defaults): ",
                            searched, ". Get them with: python3 -c \"import nltk; nltk.download('punkt_tab')\"");
  if (!pickle.empty())
    msg += str_cat(" (found ", pickle, ", NLTK 3.8's pickled form of the same parameters, which Gale does not read)");
  return NotFound(msg);
}

}  // namespace gale
