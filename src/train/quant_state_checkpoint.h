// --quant-states in checkpoints: each rank's quantised Adam moments saved and restored as they are
// (codes and block scales), so that a resumed run continues bit for bit.
//
// The checkpoint always holds the moments as f32 values too (optimizer.exp_avg.<param>, dequantised:
// the format's ordinary, reshardable state, which any run can load; a --quant-states run quantises
// it again). On top of that every rank writes, per optimizer buffer c,
//   optimizer.quantised.rank<R>.chunk<c>.exp_avg.codes / exp_avg_sq.codes    u8, one per state element
//   optimizer.quantised.rank<R>.chunk<c>.exp_avg.scales / exp_avg_sq.scales  u8 bytes of the block scales
//   optimizer.quantised.rank<R>.chunk<c>.segments                           i64 [segments, 4]: param id,
//                                                                            flat begin, numel, local numel
// and the metadata's `optimizer` section records "quant_states". A load uses rank R's tensors
// only when the checkpoint's quant_states is this run's and its segments (hence its blocks) are
// this rank's; otherwise the f32 values, quantised again, stand (the run continues, not bit for bit).
#pragma once

#include "ckpt/checkpoint_reader.h"
#include "ckpt/checkpoint_writer.h"
#include "optim/optimizer.h"

namespace gale {

// Adds rank `rank`'s quantised state of every buffer of `optimizer` (nothing without --quant-states).
Status add_quantised_state(CheckpointWriter& w, const Optimizer& optimizer, int rank);
// Restores rank `rank`'s quantised state from `r` when it matches (see above); returns whether it
// did, for every buffer. `saved_quant_states` is the checkpoint's optimizer.quant_states ("" = none).
StatusOr<bool> load_quantised_state(const CheckpointReader& r, const std::string& saved_quant_states,
                                    Optimizer& optimizer, int rank);

}  // namespace gale
