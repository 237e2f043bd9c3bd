// Megatron's fill-in-the-middle transformation of one GPT sample (GPTFIMDataset, --fim-data).
//
// A sample (the S + 1 ids of GPTDataset) is cut at every `eod` id (--fim-eod-token); each
// non-empty segment, and the segment after the last eod (even an empty one), is transformed and
// the segments are joined again with one eod each (so consecutive eods collapse into one, as in
// Megatron). With `split_sample` (--fim-split-sample) a segment holding that id draws
// binomial(1, rate) once: 0 keeps the segment, 1 cuts it the same way at `split_sample` and
// transforms each fragment with `fragment_rate`. One transformation with rate r (Megatron's
// `_permute`, truncate_or_pad False):
//   binomial(1, r) == 0: the ids unchanged;
//   else the text = decoder over the ids that are not special tokens (ids_to_text with
//   remove_special_tokens=True); text starting with `no_prefix`: unchanged; else two
//   randint(0, L + 1) (L = code points of the text), sorted, cut it into prefix / middle /
//   suffix, each encoded again (with add_special_tokens), then binomial(1, spm_rate) picks
//   SPM  [prefix_id, suffix_id] suffix [middle_id] prefix middle   (1) or
//   PSM  [prefix_id] prefix [suffix_id] suffix [middle_id] middle  (0).
// The result is cut to the sample's length, or padded with `pad` ids. The draws come from one
// numpy RandomState(--seed) per dataset and data-loader worker, in the order the samples are read
// (data/fim_dataset.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "data/numpy_random.h"
#include "tokenizer/hf_tokenizer.h"

namespace gale {

struct FimOptions {
  double rate = 0.5;      // --fim-rate
  double spm_rate = 0.5;  // --fim-spm-rate
  int32_t split_sample = -1;  // --fim-split-sample's id, -1 without it
  double fragment_rate = 0.0;  // --fim-fragment-rate (used with split_sample)
  std::optional<std::string> no_prefix;  // --fim-no-prefix
  int32_t prefix = -1, middle = -1, suffix = -1, pad = -1, eod = -1;  // --fim-*-token ids
};

// The token names of the FIM flags, looked up in the tokenizer's vocabulary.
struct FimTokenNames {
  std::string prefix = "<fim_prefix>", middle = "<fim_middle>", suffix = "<fim_suffix>", pad = "<fim_pad>",
              eod = "<|endoftext|>";
  std::optional<std::string> split_sample;
};

// Fills the ids of `names` into `options`; a name the tokenizer lacks is an error naming the flag
// and the token.
Status resolve_fim_tokens(const HuggingFaceTokenizer& tokenizer, const FimTokenNames& names, FimOptions* options);

// One sample through the transformation above, drawing from `rng`. `out` gets sample.size() ids.
Status fim_transform(std::span<const int32_t> sample, const FimOptions& options, const HuggingFaceTokenizer& tokenizer,
                     NumpyRandomState& rng, std::vector<int32_t>* out);

}  // namespace gale
