// Deterministic synthetic micro-batches for the MPI schedule benchmarks (pipeline, MoE overlap, balanced MoE).
#pragma once

#include <cstdint>

#include "core/status.h"
#include "schedule/schedules.h"

namespace gale::bench {

// Micro-batch m of a data-parallel rank: B 1, S `seq`, tokens (131·m + 7·s + 17·dp_rank) mod 1000,
// each label the token 7 ahead, positions 0..S-1, no document boundaries, every token in the loss.
inline MicroBatchSource synthetic_source(int64_t seq, int64_t dp_rank = 0) {
  return [seq, dp_rank](int64_t m, MicroBatch* mb) {
    mb->B = 1;
    mb->S = seq;
    mb->tokens.resize(seq);
    mb->labels.resize(seq);
    mb->loss_mask.assign(seq, 1.0f);
    mb->position_ids.resize(seq);
    mb->document_ids.clear();
    mb->sample_ids = {m};
    for (int64_t s = 0; s < seq; ++s) {
      mb->tokens[s] = static_cast<int32_t>((m * 131 + s * 7 + dp_rank * 17) % 1000);
      mb->labels[s] = static_cast<int32_t>((m * 131 + s * 7 + dp_rank * 17 + 7) % 1000);
      mb->position_ids[s] = static_cast<int32_t>(s);
    }
    return Status::Ok();
  };
}

}  // namespace gale::bench
