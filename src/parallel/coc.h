// Chunked compute-over-communication (MindSpeed's CoC, Megatron's --tp-comm-overlap): a TP linear's
// GEMM and its collective cut into row chunks so the collective of one chunk overlaps the GEMM of another.
//
// Activations are [T, ·] rows, t = s·B + b (sequence first, parallel/mappings.h), so under sequence
// parallelism rank r holds the contiguous rows [r·Tl, (r+1)·Tl) of the full [T, ·] tensor. Every
// function cuts this rank's Tl rows (or, without SP, the T rows) into `chunks` contiguous ranges
// (coc_row_chunks: balanced, the first Tl mod chunks one row longer, empty ones dropped, so any row
// count works) and computes `rows_fn` on each: a row-wise product (a linear layer's GEMM or its input
// gradient), whose output row depends only on its input row. The three shapes, with the layer
// passes that use them (docs/parallelism.md "Chunked TP overlap"):
//
//   coc_all_gather_rows     all-gather chunk i (all issued at once, in order), then the GEMM of
//                           chunk i as soon as it arrives while later chunks travel:
//                           column-parallel forward under SP (x gathered), row-parallel input
//                           gradient under SP (dy gathered). Also returns the gathered input, which
//                           the caller keeps (weight gradient, saved activation).
//   coc_reduce_scatter_rows the GEMM of chunk i, then its reduce-scatter while chunk i+1 multiplies:
//                           row-parallel forward under SP, column-parallel input gradient under SP.
//                           Chunk i of rank r's output rows is the sum of the rows r·Tl + [chunk i]
//                           of every rank's product, which is one reduce-scatter of the packed block.
//   coc_all_reduce_rows     the GEMM of chunk i, then its in-place all-reduce while chunk i+1
//                           multiplies: row-parallel forward and column-parallel input gradient
//                           without SP.
//
// `tail` (may be empty) runs after the last chunk's collective is issued and before any is waited
// for (after the last GEMM for the all-gather): the weight gradient, which needs the whole input,
// overlaps the last collectives there.
// Results equal the unchunked mapping + GEMM of parallel/mappings.h up to the GEMM's own blocking
// on fewer rows (bit for bit where kernels/cpu/gemm.h gemm_split_bit_exact(), else in the last
// bits) and, with more than two ranks, the MPI reduction order of a smaller message (TP 2 sums two
// values: the same bits). The bytes moved are the same; the message count is multiplied by the
// chunk count. tests/parallel/coc_mpi_test.cc checks all three against the unchunked path.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "core/tensor.h"

namespace gale {

// [start, start + size) row ranges of `rows` cut into at most `chunks` balanced parts (no empty part).
std::vector<std::pair<int64_t, int64_t>> coc_row_chunks(int64_t rows, int chunks);

// Writes out[n, N] (f32, preallocated, contiguous) = f(in[n, K]) for a block of rows.
using CocRowsFn = std::function<void(const Tensor& in, Tensor& out)>;

// x_local [Tl, K] (any dtype) -> [tp·Tl, N] f32; *x_full (may be null) gets the gathered [tp·Tl, K] input.
Tensor coc_all_gather_rows(const Tensor& x_local, Communicator& tp, int chunks, int64_t N, const CocRowsFn& f,
                           Tensor* x_full, const std::function<void()>& tail = {});
// x_full [tp·Tl, K] -> this rank's reduced rows [Tl, N] f32.
Tensor coc_reduce_scatter_rows(const Tensor& x_full, Communicator& tp, int chunks, int64_t N, const CocRowsFn& f,
                               const std::function<void()>& tail = {});
// x [T, K] -> [T, N] f32 summed over the TP ranks.
Tensor coc_all_reduce_rows(const Tensor& x, Communicator& tp, int chunks, int64_t N, const CocRowsFn& f,
                           const std::function<void()>& tail = {});

}  // namespace gale
