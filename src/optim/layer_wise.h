// Megatron's layer-wise distributed optimizer (LayerWiseDistributedOptimizer; --optimizer muon
// --use-distributed-optimizer, or the deprecated --optimizer dist_muon): which data-parallel rank
// updates each whole parameter, and the flat ranges a rank then owns (OptimizedBuffer::owned).
//
// The assignment is Megatron's ping-pong one: the trainable parameters, sorted by size (ascending,
// ties in buffer order), are dealt to the ranks 0, 1, …, n−1, n−1, …, 1, 0, 0, 1, … so that each
// rank holds a balanced share of the optimizer state. Dense parameters go over the data-parallel
// group, expert-parallel ones (ParamSpec::expert_parallel) over the expert-data-parallel group,
// each with its own deal. The size is the whole (global) tensor's, so that every tensor-parallel
// rank of a data-parallel rank owns the same parameters and their Muon collectives meet.
// Frozen parameters and buffers get no owner (−1).
#pragma once

#include <cstdint>
#include <vector>

#include "model/params.h"
#include "optim/grad_buckets.h"

namespace gale {

// Per parameter id: its owner's rank in its group (−1: none).
std::vector<int> layer_wise_owners(const ParamBuffer& pb, int64_t dp_size, int64_t expert_dp_size);

// The flat ranges of the parameters owned by `dense_rank` (dense ones) and `expert_rank`
// (expert-parallel ones), whole parameters in buffer order, adjacent ones merged.
std::vector<FlatRange> layer_wise_ranges(const ParamBuffer& pb, const std::vector<int>& owners, int dense_rank,
                                         int expert_rank);

}  // namespace gale
