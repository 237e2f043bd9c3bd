// Hand-written matchers for the pre-tokenizer regexes of byte-level BPE tokenizers, over UTF-8
// code points with the Unicode classes of unicode.h. Each produces exactly the pieces the regex
// produces with leftmost-first alternation (Python `regex`, Rust `regex`/`fancy-regex`, Oniguruma).
//
//   kGpt2:   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   kLlama3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//   ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//   kQwen2:  the same with \p{N} (one digit per piece) instead of \p{N}{1,3}
//   kTiktokenV1 (Megatron's TikTokenizer, --tiktoken-pattern v1): kQwen2 without the contractions,
//            [^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+
//            (the possessive quantifiers and the single [\r\n] give the same pieces as kQwen2's forms)
//   kTiktokenV2 (--tiktoken-pattern v2), with U = [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}], L = [\p{Ll}\p{Lm}\p{Lo}\p{M}]
//            and P = [^\r\n\p{L}\p{N}]:  P?U*L+|P?U+L*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace gale {

enum class SplitPattern { kGpt2, kLlama3, kQwen2, kTiktokenV1, kTiktokenV2 };

// Appends the end offset (bytes) of every piece of `text`, which must be valid UTF-8. The
// pieces cover the text without gaps.
void pretokenize(SplitPattern pattern, std::string_view text, std::vector<uint32_t>* ends);

// Which pattern a regex string from a tokenizer.json is (exact text, or an equivalent spelling
// used by well-known files), if any.
std::optional<SplitPattern> recognize_split_pattern(std::string_view regex);

}  // namespace gale
