// MindSpeed's LayerNorm2D / RMSNorm2D (--tp-2d): a norm over H of rows whose columns are split
// over a group (the Y axis: this rank holds H/Y of every row).
//
// The per-row statistics need sums over all H columns, so each is summed locally and all-reduced
// over the group: LayerNorm all-reduces Σx (the mean) and then Σ(x − mean)² (the variance; two
// passes, where MindSpeed all-reduces Σx and Σx² and takes E[x²] − E[x]², which loses precision
// when |mean| ≫ std); RMSNorm all-reduces Σx². Backward all-reduces Σγ·dy and Σγ·dy·x̂ (RMSNorm:
// only the second). The scale and bias are this rank's H/Y slice; their gradients accumulate
// over this rank's rows only (the caller sums them over the rows' other owners). Stats are Gale's
// norm stats: [2, rows] (mean, rstd) for LayerNorm, [1, rows] (rstd) for RMSNorm.
#pragma once

#include <cstdint>

#include "comm/communicator.h"
#include "core/tensor.h"

namespace gale {

struct Norm2dSpec {
  bool rms = false;
  float eps = 1e-5f;
  int64_t hidden = 0;  // H: the whole row's width
};

// x [rows, H/Y] f32 -> y [rows, H/Y]; *stats filled. gamma, beta: this rank's slice (beta may be null).
Tensor norm_2d_forward(const Norm2dSpec& s, const Tensor& x, const float* gamma, const float* beta, Communicator& g,
                       Tensor* stats);
// dy [rows, H/Y] -> dx; dgamma (and dbeta when non-null) += this rank's rows' sums.
Tensor norm_2d_backward(const Norm2dSpec& s, const Tensor& dy, const Tensor& x, const Tensor& stats,
                        const float* gamma, Communicator& g, float* dgamma, float* dbeta);

}  // namespace gale
