// The GPT dataset's pad id and the ambiguous-pad check.
#include "data/pad_token.h"

#include <algorithm>

namespace gale {

PadTokenChoice choose_pad_token(int32_t tokenizer_pad, std::span<const int32_t> other_special_ids,
                                bool allow_ambiguous_pad_tokens) {
  PadTokenChoice c;
  c.pad = tokenizer_pad;
  if (tokenizer_pad < 0 ||
      std::find(other_special_ids.begin(), other_special_ids.end(), tokenizer_pad) == other_special_ids.end())
    return c;
  // The wording is Megatron's (including its spelling), so that logs read the same.
  const std::string head =
      "The pad token id in the tokenizer collides with another special token id. This may cause instability and "
      "lack of covergence during training. ";
  if (allow_ambiguous_pad_tokens) {
    c.warning = head + "Do not ignore this warning if you do not understand the implications. ";
  } else {
    c.pad = -1;
    c.warning = head +
                "As such, the training flow will avoid masking out any pad tokens already present in the dataset. If "
                "you would like to disable this behavior, please provide a tokenizer with a uniquely-defined pad "
                "token id.";
  }
  return c;
}

}  // namespace gale
