// A micro-batch cut to this context-parallel rank's positions (Megatron's split or adaptive_cp_algo's layout).
#pragma once

#include <cstdint>

#include "core/status.h"
#include "model/micro_batch.h"
#include "parallel/adaptive_cp.h"
#include "parallel/parallel_state.h"

namespace gale {

// Context parallelism: keeps this cp rank's positions of each sequence of `mb` (S positions):
// Megatron's split, or under adaptive_cp_algo the layout `adaptive` chooses for the micro-batch's
// mask (every cp rank reads the same samples, so every one computes the same layout); under
// hybrid_adaptive_cp_algo that layout is the rings' and the cp ranks' follows from it. `window`:
// the model's sliding window (0: none), part of the mask. Nothing changes at CP 1. Afterwards
// mb->seq_position(i) is the whole-sequence position of local position i (the same in every row).
// The trainer's samples and GRPO's rollouts are cut by this one function.
Status keep_context_parallel_positions(const ParallelState& ps, int64_t S, int64_t window,
                                       AdaptiveCpPlanner* adaptive, MicroBatch* mb);

}  // namespace gale
