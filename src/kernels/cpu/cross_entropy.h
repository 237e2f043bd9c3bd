// Softmax cross-entropy over a (possibly vocab-parallel) slice of the logits: reference kernels.
//
// logits is [T, Vl]: this rank's columns [vocab_start, vocab_start + Vl) of the full vocabulary.
// The loss needs three reductions over the full vocabulary, so the kernel is split where a
// tensor-parallel caller all-reduces (max, then sum) between the steps:
//   1. ce_row_max            row_max[t]     = max_v logits[t, v]                (then all-reduce max)
//   2. ce_sumexp_and_target  sumexp[t]      = Σ_v exp(logits[t, v] − row_max[t]) (then all-reduce sum)
//                            target_logit[t]= logits[t, target[t]] or 0 when the target is not local
//   3. loss[t] = log(sumexp[t]) + row_max[t] − target_logit[t]
// Backward overwrites the logits with their gradient (softmax − one-hot)·dloss[t], so no second
// [T, V] tensor is needed.
#pragma once

#include <cstdint>

namespace gale {

void ce_row_max(const float* logits, int64_t T, int64_t Vl, float* row_max);
void ce_sumexp_and_target(const float* logits, int64_t T, int64_t Vl, const float* row_max, const int32_t* targets,
                          int64_t vocab_start, float* sumexp, float* target_logit);
void ce_backward_inplace(float* logits, int64_t T, int64_t Vl, const float* row_max, const float* sumexp,
                         const int32_t* targets, int64_t vocab_start, const float* dloss);

}  // namespace gale
