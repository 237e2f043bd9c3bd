// LongRoPE rotary tables (Phi-3 / Phi-3.5's rope_scaling longrope; MindSpeed-LLM's --rope-scaling-type longrope).
//
// Over a rotary width R (the first R dimensions of a head, halves rotating as plain RoPE), pair i < R/2
// turns at inv_freq_i = 1 / (factor_i · base^(2i/R)), factor_i from --short-factor or --long-factor,
// and cos/sin are multiplied by that table's mscale:
//   --short-mscale / --long-mscale when given (both or neither), else for both tables the attention
//   factor sqrt(1 + ln(P/O) / ln O) with P = --max-position-embeddings, O = the original context
//   (--rope-scaling-original-max-position-embeddings), or 1 when P ≤ O (Hugging Face's Phi-3 and
//   MindSpeed-LLM's default).
// Which table a forward uses (GPTModel):
//   the training and evaluation forward (loss, gradients; sharded by CP): the long one iff --seq-length
//     > O (MindSpeed-LLM's choice; every CP / TP rank makes the same one);
//   logits of whole sequences and decoding (forward_logits with or without a KV cache, ragged decoding,
//     MTP drafts; `gale generate`): the long one iff the micro-batch's largest position + 1, the total
//     length so far, exceeds O, as Hugging Face's Phi-3 picks its factors from max(position_ids) + 1 on
//     every forward. Keys already cached keep the rotation they were stored with (Hugging Face does not
//     recompute its cache either), so a generation that crosses O mixes both, exactly as transformers does.
#pragma once

#include <cstdint>

#include "kernels/cpu/rope.h"
#include "model/config.h"

namespace gale {

// sqrt(1 + ln(max_positions / original) / ln(original)); 1 when max_positions ≤ original.
double longrope_default_mscale(int64_t max_positions, int64_t original_max_positions);

// The table [max_positions, rot_dim/2] of `lr`'s long (use_long) or short factors and mscale. The
// factor list has rot_dim/2 entries (checked).
RopeTables make_longrope_tables(const LongRopeConfig& lr, bool use_long, int64_t max_positions, int64_t rot_dim,
                                double base);

// Whether a forward uses the long table: by_length, the largest of `positions` + 1 > original (Hugging
// Face's rule), else lr.long_without_cache (MindSpeed-LLM's --seq-length rule; see above).
bool longrope_use_long(const LongRopeConfig& lr, bool by_length, const int32_t* positions, int64_t count);

}  // namespace gale
