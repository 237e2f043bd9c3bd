// Unicode normalisation forms and full lowercasing through ICU (libicu), for the NFC / NFKC /
// NFD / NFKD / Lowercase normalizers of tokenizer.json files.
#pragma once

#include <string>

#include "core/status.h"

namespace gale {

enum class NormalForm { kNfc, kNfd, kNfkc, kNfkd };

// Normalises valid UTF-8 in place (ASCII text is returned untouched without calling ICU).
Status unicode_normalize(NormalForm form, std::string* text);
// Full Unicode lowercasing (root locale, with final-sigma handling) in place.
Status unicode_lowercase(std::string* text);

}  // namespace gale
