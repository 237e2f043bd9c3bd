// Causal depthwise convolution along the sequence (Mamba's and Gated DeltaNet's conv1d), forward and backward.
//
// Rows t = s·B + b of [T, ·] activations (T = S·B). Channel c of row t reads its input at column c of
// x + t·x_stride (a strided view into a wider projection output) and writes
//   y[t, c] = bias[c] + Σ_{k<K} w[c·K + k]·x[(s − K + 1 + k)·B + b, c]     (zero input before s = 0)
// into y [T, C]. bias may be null (none). w is PyTorch's conv1d weight [C, 1, K] read as [C, K].
#pragma once

#include <cstdint>

namespace gale {

void causal_conv1d_forward(const float* x, int64_t x_stride, const float* w, const float* bias, float* y, int64_t C,
                           int64_t K, int64_t S, int64_t B);
// From dy [T, C]: dx (stride dx_stride) += ∂/∂x, dw [C, K] += ∂/∂w, db [C] += ∂/∂bias; null
// dw / db: not accumulated.
void causal_conv1d_backward(const float* dy, const float* x, int64_t x_stride, const float* w, float* dx,
                            int64_t dx_stride, float* dw, float* db, int64_t C, int64_t K, int64_t S, int64_t B);

}  // namespace gale
