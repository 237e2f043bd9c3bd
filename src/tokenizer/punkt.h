// NLTK's Punkt sentence splitter with pre-trained parameters, for `gale preprocess --split-sentences`
// (Megatron's tools/preprocess_data.py splits documents with it).
//
// The algorithm is that of NLTK's PunktSentenceTokenizer (3.8.1, the last release whose `nltk.load`
// reads the `punkt/PY3/<lang>.pickle` files Megatron asks for; 3.9 has the same tokenizer code):
//   1. every '.', '?' or '!' followed by other punctuation, or by whitespace and a token, is a
//      candidate; its context is the word before it, itself and the token after it;
//   2. the context is split into word tokens and annotated: a first pass marks sentence breaks,
//      abbreviations (the parameters' list) and ellipses by the token alone; a second pass revises
//      period-final tokens by the next token (collocations, the orthographic heuristic over the
//      parameters' case statistics, frequent sentence starters, initials and numbers);
//   3. a candidate whose context holds a break before its last token ends a sentence; closing
//      quotes and brackets after a break are moved into the sentence before it.
// Positions are Unicode code points, as in Python; the character classes are Python's (`\s` is
// str.isspace, `\w` is alphanumeric or '_', `\d` is a decimal digit, case is the Uppercase and
// Lowercase properties, types are lowercased fully), answered by ICU.
//
// `keep_newlines` is Megatron's --keep-newlines: its CustomLanguageVars, whose candidate takes the
// whitespace after the sentence end into the sentence, so newlines survive in the sentences.
#pragma once

#include <cstddef>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/status.h"

namespace gale {

// What Punkt learnt from a corpus (NLTK's PunktParameters). Types are lowercased tokens without
// their final period; numbers are "##number##".
struct PunktParameters {
  std::unordered_set<std::string> abbrev_types;
  std::set<std::pair<std::string, std::string>> collocations;
  std::unordered_set<std::string> sent_starters;
  std::unordered_map<std::string, int> ortho_context;  // bit flags, NLTK's _ORTHO_* values
};

// Reads NLTK 3.9's punkt_tab directory (abbrev_types.txt, collocations.tab, sent_starters.txt,
// ortho_context.tab: one entry per line, tab-separated fields). Errors name the file and line.
StatusOr<PunktParameters> load_punkt_tab(const std::string& dir);

// Where NLTK looks for `tokenizers/punkt_tab/<lang>/`: each directory of $NLTK_DATA (':'-separated),
// ~/nltk_data, /usr/share/nltk_data, /usr/local/share/nltk_data, /usr/lib/nltk_data,
// /usr/local/lib/nltk_data. The first that has it wins; otherwise a NotFound error lists the
// directories searched and how to get the data (a `punkt/PY3/<lang>.pickle` found instead is
// named in the error: Gale reads the punkt_tab form of the same parameters).
StatusOr<std::string> find_punkt_tab(const std::string& lang);

class PunktSentenceSplitter {
 public:
  PunktSentenceSplitter(PunktParameters params, bool keep_newlines);

  // NLTK's span_tokenize(text) with realign_boundaries: the [begin, end) code-point spans of the
  // sentences of `text` (valid UTF-8). A span may be empty (begin >= end), as in NLTK.
  std::vector<std::pair<size_t, size_t>> span_tokenize(std::string_view text) const;

  // The sentences as byte ranges of `text` (NLTK's tokenize(text)); empty spans give empty views.
  std::vector<std::string_view> split(std::string_view text) const;

 private:
  PunktParameters params_;
  bool keep_newlines_;
};

}  // namespace gale
