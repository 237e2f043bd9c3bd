// Which positions of a sequence each context-parallel rank holds (Megatron's load-balanced split).
//
// With context parallelism of size N a sequence of S_global positions is cut into 2·N equal chunks
// of C = S_global / (2·N) positions, and cp rank r holds chunk r followed by chunk 2N−1−r, so
// that under a causal mask every rank has the same amount of attention work (Megatron-Core's
// get_batch_on_this_cp_rank; MindSpeed's megatron_cp_algo). Local position s of rank r is global
// position r·C + s for s < C and (2N−1−r)·C + (s − C) otherwise. With N = 1 the split is the
// identity. Activations are [S, B, ...] with row t = s·B + b, so each chunk is a contiguous
// range of C·B rows.
//
// Under --context-parallel-algo adaptive_cp_algo the positions come from an explicit layout
// chosen per micro-batch (`layout`, parallel/cp_layout.h, parallel/adaptive_cp.h) instead of the
// formula; chunk_length() then has no meaning (the all-gather and Ulysses paths, which use it,
// never run with a layout).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/status.h"
#include "parallel/cp_layout.h"

namespace gale {

struct ContextSplit {
  int64_t seq_length = 0;  // S_global: positions of the whole sequence
  int64_t cp_size = 1;
  int64_t cp_rank = 0;
  // adaptive_cp_algo: the micro-batch's layout (positions of every rank, empty blocks); null: the formula.
  std::shared_ptr<const CpLayout> layout;

  // Positions per chunk (C) and held by each rank (2·C = S_global / N).
  int64_t chunk_length() const { return seq_length / (2 * cp_size); }
  int64_t local_length() const { return seq_length / cp_size; }
  // Global position of local position s of rank `rank`.
  int64_t global_position(int64_t s, int64_t rank) const;
  int64_t global_position(int64_t s) const { return global_position(s, cp_rank); }
  // The global position of each local position of this rank, in local order.
  std::vector<int32_t> local_positions() const;
};

// The split of a --seq-length over --context-parallel-size ranks, or an error naming both flags
// when the length is not a multiple of 2·N.
StatusOr<ContextSplit> make_context_split(int64_t seq_length, int64_t cp_size, int64_t cp_rank);

}  // namespace gale
