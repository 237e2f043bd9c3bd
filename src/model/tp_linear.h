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
//
// With `regather_input` (--use-ascend-mc2, MindSpeed's MC2 linears) under SP at TP > 1, the
// column-parallel forward keeps only this rank's input rows [Tl, in] for backward instead of the
// gathered [T, in]; backward all-gathers them again while dy·W runs, then reduce-scatters dx while
// dW += dyᵀ·x_full runs (MindSpeed's ColumnSeqParallelLinearFunction with all-gather recomputation).
// The products are the same GEMMs on the same values, so the results equal the chunked path's.
#pragma once

#include "comm/communicator.h"
#include "core/tensor.h"
#include "model/linear.h"

namespace gale {

// How a layer's TP linears communicate: the TP group, sequence parallelism, the CoC chunk count.
// A null group makes each of the four functions below the plain linear (a mixer called outside a
// layer at TP 1, e.g. by its unit tests).
struct TpLinearComm {
  Communicator* tp = nullptr;  // null: no TP group (plain linears)
  bool sequence_parallel = false;
  int chunks = 1;  // 1: the plain mappings (parallel/mappings.h)
  bool regather_input = false;  // --use-ascend-mc2 (see above)
  bool chunked() const { return chunks > 1 && tp != nullptr && tp->size() > 1; }
  // Whether column-parallel linears keep only this rank's input rows for backward.
  bool keeps_local_input() const { return regather_input && sequence_parallel && tp != nullptr && tp->size() > 1; }
};

// x: this rank's input [Tl, in] under SP, else [T, in] -> y [T, out] (f32); *x_saved gets what
// backward takes: the GEMM's input [T, in] (gathered under SP), or x itself when
// c.keeps_local_input().
Tensor column_parallel_linear_forward(const TpLinearComm& c, const Tensor& x, const LinearWeight& w, Tensor* x_saved);
// dy [T, out], x_saved as forward left it -> dx [Tl, in] (SP) or [T, in], summed over TP; dW accumulated.
Tensor column_parallel_linear_backward(const TpLinearComm& c, const Tensor& dy, const Tensor& x_saved,
                                       const LinearWeight& w);
// x [T, in] (this rank's slice of in) -> y [Tl, out] (SP) or [T, out], summed over TP (f32).
Tensor row_parallel_linear_forward(const TpLinearComm& c, const Tensor& x, const LinearWeight& w);
// dy [Tl, out] (SP) or [T, out], x [T, in] -> dx [T, in]; dW accumulated.
Tensor row_parallel_linear_backward(const TpLinearComm& c, const Tensor& dy, const Tensor& x, const LinearWeight& w);

}  // namespace gale
