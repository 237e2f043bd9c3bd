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

// Megatron's --test-mode (TransformerConfig.test_mode, Attention.run_realtime_tests): the
// self-attention q_layernorm/k_layernorm parameters (--qk-layernorm; the names
// "...self_attention.q_layernorm.*" and "...k_layernorm.*") are replicated over the data-parallel
// and the tensor-parallel group and must be identical on every rank of both. Their values are
// all-gathered over `dp`, then over `tp`, and compared element by element with rank 0's; every
// rank of the group reaches the same verdict, so all stop together with "--test-mode: discrepancy
// between NAME of model chunk C in data-parallel ranks R and 0 (norm of the difference X)"
// ("tensor-parallel" for `tp`). Ok when the model has no such parameters. Megatron compares
// each rank with every other in each attention forward; Gale compares all with rank 0, once per
// training or evaluation iteration (the parameters change only at the optimizer step).
Status check_qk_layernorm_replicas(const std::vector<const ParamBuffer*>& chunks, const Comm& dp, const Comm& tp);

}  // namespace gale
