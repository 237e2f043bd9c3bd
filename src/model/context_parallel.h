// Context parallelism inside the model: a micro-batch cut to one cp rank's positions.
#pragma once

#include <cstdint>

#include "model/micro_batch.h"
#include "parallel/context_split.h"

namespace gale {

// The part of `full` (a micro-batch of whole sequences, S = split.seq_length) that cp rank
// split.cp_rank holds: tokens, labels, loss mask, position and document ids sliced to its
// positions; seq_positions and S_global set; key_document_ids = the whole sequences' document ids
// (when `full` has document ids). With cp_size 1 returns `full` unchanged.
MicroBatch slice_micro_batch(const MicroBatch& full, const ContextSplit& split);

}  // namespace gale
