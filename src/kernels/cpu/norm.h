// LayerNorm and RMSNorm over the last dimension: plain reference kernels (level 0).
//
// Rows are independent: x is [rows, H]. Forward writes y and the per-row statistics that the
// backward needs (mean and rstd = 1/sqrt(var + eps) for LayerNorm; rstd for RMSNorm).
// Backward WRITES dx and ACCUMULATES (+=) into dw and db (the gradient-accumulation contract of
// every parameter gradient in Gale, see kernels/op_table.h). Weight/bias gradients are reduced
// over fixed row chunks in a fixed order, so results do not depend on the thread count.
#pragma once

#include <cstdint>

namespace gale {

void layernorm_forward_ref(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd,
                           int64_t rows, int64_t H, float eps);
void layernorm_backward_ref(const float* dy, const float* x, const float* w, const float* mean, const float* rstd,
                            float* dx, float* dw, float* db, int64_t rows, int64_t H);

void rmsnorm_forward_ref(const float* x, const float* w, float* y, float* rstd, int64_t rows, int64_t H, float eps);
void rmsnorm_backward_ref(const float* dy, const float* x, const float* w, const float* rstd, float* dx, float* dw,
                          int64_t rows, int64_t H);

// Sum over rows of a [rows, H] matrix into out[H] (+=), deterministic (fixed chunks). Used for
// bias gradients and norm weight gradients.
void column_sum_accumulate(const float* x, float* out, int64_t rows, int64_t H);
// out[H] += Σ_rows a[r, :] * b[r, :] (deterministic), used for norm weight gradients.
void column_dot_accumulate(const float* a, const float* b, float* out, int64_t rows, int64_t H);

}  // namespace gale
