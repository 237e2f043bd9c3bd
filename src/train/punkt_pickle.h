// NLTK 3.8's pickled Punkt parameters (nltk_data's tokenizers/punkt/PY3/<lang>.pickle, which
// Megatron's preprocess_data.py loads), read with ckpt/pickle.h for `gale preprocess --split-sentences`.
#pragma once

#include <string>

#include "core/status.h"
#include "tokenizer/punkt.h"

namespace gale {

// The file holds a pickled nltk.tokenize.punkt.PunktSentenceTokenizer (or PunktParameters): its
// _params' abbrev_types, collocations, sent_starters (sets of strings, collocations of string
// pairs) and ortho_context (a defaultdict of string to int flags). Only values are read; no Python
// code runs. Errors name the file and what was expected and found.
StatusOr<PunktParameters> load_punkt_pickle(const std::string& path);

}  // namespace gale
