// Linear layers y = x·Wᵀ on [rows, in] activations with [out, in] weights (sgemm calls).
#pragma once

#include "core/tensor.h"

namespace gale {

// y[M, N] = x[M, K] · W[N, K]ᵀ
Tensor linear_forward(const Tensor& x, const float* W, int64_t N);
// dx[M, K] = dy[M, N] · W[N, K]   (written)
Tensor linear_backward_data(const Tensor& dy, const float* W, int64_t K);
// dW[N, K] += dy[M, N]ᵀ · x[M, K]   (accumulated)
void linear_backward_weight(const Tensor& dy, const Tensor& x, float* dW);

}  // namespace gale
