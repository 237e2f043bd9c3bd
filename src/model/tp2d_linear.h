// MindSpeed's ParallelLinear2D (--tp-2d): a linear layer on 2-D sharded activations and weights.
//
// Two groups take part, `ag` (the all-gather axis, a ranks) and `rs` (the reduce-scatter axis, r
// ranks). This rank holds the input rows [T/a] (its chunk of the ag group's T rows) and columns
// in/r, and the weight block [out/a, in/r] (rows: its ag rank's, columns: its rs rank's):
//
//   forward:  x [T/a, in/r] --all-gather rows over ag--> x_full [T, in/r]
//             y = x_full·Wᵀ [T, out/a] (partial: summed over the rs group's input columns)
//             --reduce-scatter rows over rs--> [T/r, out/a]
//   backward: dy [T/r, out/a] --all-gather rows over rs--> dy_full [T, out/a]
//             dW += dy_fullᵀ·x_full;  dx_full = dy_full·W [T, in/r] (partial over ag's outputs)
//             --reduce-scatter rows over ag--> dx [T/a, in/r]
//
// The column-parallel form (linear_qkv, linear_fc1) has ag = X, rs = Y: [T/X, H/Y] -> [T/Y, E/X];
// the row-parallel form (linear_proj, linear_fc2) ag = Y, rs = X: [T/Y, E/X] -> [T/X, H/Y]. Biases
// are the caller's (added to the output rows it holds). MindSpeed's overlapped variants
// (--enable-overlap-ag-with-matmul, ...) are not implemented: the collectives run before / after
// the GEMMs.
#pragma once

#include "comm/communicator.h"
#include "core/tensor.h"
#include "model/linear.h"

namespace gale {

// x: f32 or the GEMM input type; *x_full gets the gathered input (backward's). Returns f32.
Tensor linear_2d_forward(const Tensor& x, const LinearWeight& w, Communicator& ag, Communicator& rs, Tensor* x_full);
// dy [T/r, out/a] (f32) -> dx [T/a, in/r] (f32); dW accumulated.
Tensor linear_2d_backward(const Tensor& dy, const Tensor& x_full, const LinearWeight& w, Communicator& ag,
                          Communicator& rs);

}  // namespace gale
