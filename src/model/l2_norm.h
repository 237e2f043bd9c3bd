// --qk-l2-norm's weightless L2 norm of rows (Megatron main's L2Norm): forward and backward.
#pragma once

#include <cstdint>

namespace gale {

// y[r, :] = x[r, :] · inv[r], inv[r] = 1 / sqrt(mean_j x[r, j]² + eps), for `rows` rows of `dim`
// values (Megatron's L2Norm: the mean of the squares, not their sum, so each output row has a
// mean square of about 1; no weight, no bias). inv [rows] keeps the scales for the backward.
// y may alias x.
void l2_norm_forward(const float* x, float* y, float* inv, int64_t rows, int64_t dim, float eps);

// The gradient before the norm from dy (after it), the input x and the forward's inv:
// dx[r, j] = inv[r]·dy[r, j] − x[r, j]·inv[r]³·mean_i(dy[r, i]·x[r, i]). dx may alias dy.
void l2_norm_backward(const float* dy, const float* x, const float* inv, float* dx, int64_t rows, int64_t dim);

}  // namespace gale
