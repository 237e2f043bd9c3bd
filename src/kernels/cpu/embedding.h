// Token embedding lookup and its gradient over a (possibly vocab-parallel) table: reference kernels.
#pragma once

#include <cstdint>

namespace gale {

// out[t, :] = W[ids[t] − vocab_start, :] for ids in [vocab_start, vocab_start + Vl), else 0.
// W is [Vl, H], out is [T, H].
void embedding_forward_ref(const int32_t* ids, int64_t T, const float* W, int64_t vocab_start, int64_t Vl, int64_t H,
                           float* out);
// dW[ids[t] − vocab_start, :] += dout[t, :] for local ids (ACCUMULATES). Parallel over columns, so
// repeated ids never race and the sum order is fixed.
void embedding_backward_ref(const int32_t* ids, int64_t T, const float* dout, int64_t vocab_start, int64_t Vl,
                            int64_t H, float* dW);

}  // namespace gale
