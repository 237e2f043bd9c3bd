// --tp-2d communication as adjoint forward/backward pairs: the [T/X, H/Y] piece of a replicated
// [T, H] tensor, and the Ulysses-style trade of the Y-axis row split for a column (head) split.
//
// Under --tp-2d (parallel/tp2d_groups.h) a transformer layer's activations are pieces: the rank at
// (x, y) holds rows [x·T/X, (x+1)·T/X) (whole sequence positions, rows are t = s·B + b) and
// columns [y·H/Y, (y+1)·H/Y). Forward and backward (tests/parallel/tp2d_mpi_test.cc checks
// <f(a), b> = <a, f*(b)> across ranks):
//
//   forward                          backward
//   scatter_to_2d_piece   take piece    all-gather rows over X, columns over Y (the whole [T, H])
//   gather_from_2d_piece  all-gather    take piece (every rank's gradient of [T, H] is the same)
//   rows_to_heads         all-to-all over a group of n: [R, W] -> [n·R, W/n]
//   heads_to_rows         its inverse (each is the other's backward: both are permutations)
//
// rows_to_heads: this rank's R rows (chunk k of the group's n·R rows, rank order) with W columns
// of n equal blocks -> every rank's rows for column block k (this rank's group rank). MindSpeed
// runs attention this way (its Ulysses attention over the tp-y group): the packed QKV rows of a
// chunk of positions for the X-axis rank's query groups become all positions for 1/Y of them.
#pragma once

#include "comm/communicator.h"
#include "core/tensor.h"

namespace gale {

// full [T, H] (the same on every TP rank) -> this rank's piece [T/X, H/Y] (a new tensor).
Tensor scatter_to_2d_piece(const Tensor& full, Communicator& x, Communicator& y);
Tensor scatter_to_2d_piece_backward(const Tensor& d_piece, Communicator& x, Communicator& y);
// piece [T/X, H/Y] -> the whole [T, H].
Tensor gather_from_2d_piece(const Tensor& piece, Communicator& x, Communicator& y);
Tensor gather_from_2d_piece_backward(const Tensor& d_full, Communicator& x, Communicator& y);

// [R, W] -> [n·R, W/n] over `g` (n = g.size()); f32, bf16 or f16.
Tensor rows_to_heads(const Tensor& x, Communicator& g);
// [n·R, W/n] -> [R, W].
Tensor heads_to_rows(const Tensor& x, Communicator& g);

}  // namespace gale
