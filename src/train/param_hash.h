// Megatron's --check-weight-hash-across-dp-replicas-interval (check_param_hashes_across_dp_replicas):
// every data-parallel replica must hold the same parameters.
//
// Each rank hashes every parameter it holds (its local values, as fp32 bytes), all-gathers the
// hashes over the data-parallel group (expert-parallel parameters over the expert-data-parallel
// group) and compares every rank's hashes with every other rank's (Megatron's cross_check). Every
// rank sees all hashes, so all reach the same verdict and stop together. Megatron hashes with
// SHA-1; Gale with 64-bit FNV-1a over the same bytes (the hashes are only compared, never shown).
// With the distributed optimizer the check runs on the full parameters (after the all-gather;
// the caller finishes an --overlap-param-gather in flight first).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/status.h"
#include "model/params.h"

namespace gale {

// 64-bit FNV-1a of the bytes of `n` floats.
uint64_t param_hash(const float* data, int64_t n);

// Hashes every parameter of `chunks` (this rank's model chunks, in order), gathers the hashes of
// dense parameters over `dp` and of expert-parallel ones over `expert_dp` (may be null when no
// chunk has any), and compares all ranks'. Ok when they all agree. Otherwise every rank logs, on
// stderr, the parameters where it differs from data-parallel rank 0 ("[Rank R] Hash not matching
// for NAME in model chunk C", Megatron's line) and every rank returns the same error:
// "Parameter hashes not matching across DP replicas (data-parallel rank R differs from rank 0 in
// NAME of model chunk C)".
Status check_param_hashes_across_dp_replicas(const std::vector<const ParamBuffer*>& chunks, const Comm& dp,
                                             const Comm& expert_dp);

}  // namespace gale
