// Tensor-parallel linear layers with their TP communication: the plain mappings, or chunked
// compute-over-communication (--use-ascend-coc / --tp-comm-overlap, parallel/coc.h).
//
// Column-parallel (W split on out): forward gathers the input over the sequence under SP (identity
// otherwise) and multiplies; backward multiplies dy·W and reduce-scatters it under SP (all-reduces
// otherwise), and accumulates dW += dyᵀ·x_full. Row-parallel (W split on in): forward multiplies
// and reduce-scatters (SP) or all-reduces the partial sums; backward all-gathers dy under SP
// (identity otherwise), multiplies and accumulates dW. With `chunks` > 1 and TP > 1 every pair that
// communicates runs chunked (parallel/coc.h); the weight gradient is then one GEMM over the whole
// rows, as unchunked (so it sums in the same order), run while the last chunks' collectives travel.
// The identity steps (column forward and row backward without SP) have nothing to overlap and run
// as plain GEMMs. Rows are t = s·B + b and this rank's SP rows are contiguous, so micro-batches of
// any size and row counts not divisible by `chunks` need nothing special.
#pragma once

#include "comm/communicator.h"
#include "core/tensor.h"
#include "model/linear.h"

namespace gale {

// How a layer's TP linears communicate: the TP group, sequence parallelism, the CoC chunk count.
struct TpLinearComm {
  Communicator* tp = nullptr;
  bool sequence_parallel = false;
  int chunks = 1;  // 1: the plain mappings (parallel/mappings.h)
  bool chunked() const { return chunks > 1 && tp != nullptr && tp->size() > 1; }
};

// x: this rank's input [Tl, in] under SP, else [T, in] -> y [T, out] (f32); *x_full gets the
// GEMM's input [T, in] (gathered under SP), which backward takes.
Tensor column_parallel_linear_forward(const TpLinearComm& c, const Tensor& x, const LinearWeight& w, Tensor* x_full);
// dy [T, out], x_full [T, in] -> dx [Tl, in] (SP) or [T, in], summed over TP; dW accumulated.
Tensor column_parallel_linear_backward(const TpLinearComm& c, const Tensor& dy, const Tensor& x_full,
                                       const LinearWeight& w);
// x [T, in] (this rank's slice of in) -> y [Tl, out] (SP) or [T, out], summed over TP (f32).
Tensor row_parallel_linear_forward(const TpLinearComm& c, const Tensor& x, const LinearWeight& w);
// dy [Tl, out] (SP) or [T, out], x [T, in] -> dx [T, in]; dW accumulated.
Tensor row_parallel_linear_backward(const TpLinearComm& c, const Tensor& dy, const Tensor& x, const LinearWeight& w);

}  // namespace gale
