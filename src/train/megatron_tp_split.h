// How Megatron-Core's tensor parallelism splits a GPT tensor: the split of each name, merging TP pieces, cutting them.
//
//   MegatronSplit s = megatron_split_of("decoder.layers.0.mlp.linear_fc1.weight", /*swiglu=*/true);  // kGatedRows
//   GALE_ASSIGN_OR_RETURN(Tensor whole, megatron_merge_tp(parts, s, name, where));  // parts[t]: TP rank t's piece
//   GALE_ASSIGN_OR_RETURN(Tensor piece, megatron_cut_tp(whole, s, tp, t, name));    // the inverse
//
// Rows (dim 0) of linear_qkv (whole query groups), the learnable softmax offsets (--softmax-type learnable, per
// head), word_embeddings, output_layer, an MTP layer's eh_proj, linear_fc1 and multi-latent
// attention's column-parallel projections; with SwiGLU each rank's fc1 holds [its gate rows; its up rows], so the
// merged tensor is [gate_0 .. gate_{TP-1}; up_0 .. up_{TP-1}]; columns (dim 1) of linear_proj and linear_fc2;
// norms, row-parallel biases and position embeddings replicated. The names may be Megatron's torch-format or
// torch_dist names (stacked "decoder.layers.<rest>" included: the split is of one layer's tensor).
// Used by the torch-format reader and writer (megatron_checkpoint.cc) and the bucket-space optimizer state of
// TP > 1 runs (megatron_bucket_optimizer.cc).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace gale {

// How tensor parallelism splits a tensor (Megatron-Core's GPT layers; MoE experts and shared experts as the dense
// MLP, with expert TP = TP).
enum class MegatronSplit { kReplicated, kRows, kColumns, kGatedRows };

MegatronSplit megatron_split_of(const std::string& name, bool swiglu);

// Copies rows [r0, r0 + n) of `src` (any dtype, rows along dim 0) into `dst` (same dtype and row size) at row d0.
void megatron_copy_rows(const Tensor& src, int64_t r0, int64_t n, Tensor& dst, int64_t d0);

// The whole tensor from TP rank t's pieces parts[t] (equal shapes and dtypes; replicated: a copy of parts[0]).
// Errors (DataLoss, naming `where` and `name`): pieces that differ, a scalar or odd SwiGLU rows to split, a
// column-split piece that is not 2-D.
StatusOr<Tensor> megatron_merge_tp(const std::vector<Tensor>& parts, MegatronSplit split, const std::string& name,
                                   const std::string& where);

// TP rank t's piece of `whole` (of `tp`); InvalidArgument when the split dimension does not divide.
StatusOr<Tensor> megatron_cut_tp(const Tensor& whole, MegatronSplit split, int64_t tp, int64_t t,
                                 const std::string& name);

}  // namespace gale
