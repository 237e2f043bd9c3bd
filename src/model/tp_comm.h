// Tensor-parallel collectives on [tokens, H] activations, as the model uses them.
//
// With sequence parallelism the tokens (rows t = s·B + b) of a TP rank are a contiguous block of
// S/TP sequence positions, so gathering and scattering along the sequence are plain all-gather /
// reduce-scatter of row blocks. Each forward operation's backward is its conjugate:
//   all-reduce (forward of a row-parallel output)   <-> identity
//   identity (input of a column-parallel layer)     <-> all-reduce
//   all-gather rows (SP, into a column-parallel)    <-> reduce-scatter rows
//   reduce-scatter rows (SP, out of a row-parallel) <-> all-gather rows
#pragma once

#include "core/tensor.h"
#include "model/config.h"

namespace gale {

// In place: x = Σ over TP ranks of x.
void tp_all_reduce(const ModelPartition& part, Tensor& x);
// [T/TP, ...] on each rank -> [T, ...] (rank blocks in order). Returns `local` when TP == 1.
Tensor tp_all_gather_rows(const ModelPartition& part, const Tensor& local);
// [T, ...] partial sums on each rank -> this rank's block [T/TP, ...] of the sum. Returns `full` when TP == 1.
Tensor tp_reduce_scatter_rows(const ModelPartition& part, const Tensor& full);

}  // namespace gale
