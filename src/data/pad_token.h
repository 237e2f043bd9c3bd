// The pad id a GPT dataset masks (Megatron-LM main's MegatronDataset and --allow-ambiguous-pad-tokens).
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace gale {

// Megatron-LM main's MegatronDataset: the tokenizer's pad id (-1 when it has none, _PAD_TOKEN_ID),
// unless that id is one of the tokenizer's other special ids (its eod/eos): then the pad becomes -1
// ("ambiguous"; no label is masked as padding), or with --allow-ambiguous-pad-tokens stays the
// tokenizer's (labels equal to it, e.g. every end-of-document, then get no loss). Either way the
// collision gives Megatron's warning text in `warning`; otherwise `warning` is empty.
struct PadTokenChoice {
  int32_t pad = -1;
  std::string warning;
};
PadTokenChoice choose_pad_token(int32_t tokenizer_pad, std::span<const int32_t> other_special_ids,
                                bool allow_ambiguous_pad_tokens);

}  // namespace gale
