// A dense transformer layer under MindSpeed's 2-D tensor parallelism (--tp-2d --tp-x X --tp-y Y).
//
// The TP group is an X×Y grid (parallel/tp2d_groups.h, rank (x, y)). Between and inside layers the
// residual stream is a piece [T/X, H/Y]: rows of chunk x of the T = S·B rows, columns of chunk y.
//   x_in [T/X, H/Y] -> norm1 (model/tp2d_norm.h, statistics all-reduced over Y)
//   -> linear_qkv (model/tp2d_linear.h, ag X, rs Y) [T/Y, (NH+2KV)·HD / X]: query groups of chunk x
//   -> rows_to_heads over Y [T, (NH+2KV)·HD / (X·Y)]: all positions, 1/Y of those groups
//   -> (--qk-layernorm) RoPE -> core attention (model/core_attention.h, heads (x·Y + y)·NH/(X·Y) ...)
//   -> heads_to_rows over Y [T/Y, NH·HD/X] -> linear_proj (ag Y, rs X) [T/X, H/Y]
//   -> x_mid = x_in + dropout(. + b_proj) -> norm2 -> linear_fc1 (ag X, rs Y) [T/Y, Fin/X]
//   -> GeLU / SwiGLU [T/Y, F/X] -> linear_fc2 (ag Y, rs X) [T/X, H/Y] -> x_out = x_mid + dropout(...)
// Weights are 2-D blocks (ParamSpec::split2_*): linear_qkv / linear_fc1 [out/X, H/Y] (SwiGLU: the
// gate and up halves each split over X), linear_proj / linear_fc2 [H/Y, in/X]. Norm weights and
// biases and the linear biases are kept whole on every TP rank; each rank uses its slice, and
// their gradients (each rank's slice over its rows) are summed over TP as the sequence-parallel
// ones are (ParamSpec::sequence_parallel). Hidden dropout draws its mask at global (row, column)
// indices, so it is the single-process mask.
//
// With context parallelism the rows are the cp rank's positions and core attention exchanges keys
// and values (or trades positions for heads) over the cp group as in the 1-D layer. Not supported
// here (validation refuses them with --tp-2d, train/arguments_tp2d.cc): MoE, MLA, LoRA, the
// partial recomputations (norm, activation, --recompute-modules), incremental decoding.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "model/config.h"
#include "model/layer_runtime.h"
#include "model/params.h"
#include "model/transformer_layer.h"

namespace gale {

// Registers a --tp-2d layer's parameters (same names and global shapes as the 1-D layer).
LayerParamIds register_tp2d_layer_params(ParamBuffer& pb, const ModelConfig& c, const ModelPartition& part,
                                         int64_t layer);
// x_in [T/X, H/Y] -> x_out [T/X, H/Y].
Tensor tp2d_layer_forward(const LayerRuntime& rt, const ParamBuffer& pb, const LayerParamIds& w, int64_t layer,
                          const Tensor& x_in, LayerSaved* saved);
// d_out [T/X, H/Y] -> d_x_in; parameter gradients accumulated; releases `s`.
Tensor tp2d_layer_backward(const LayerRuntime& rt, ParamBuffer& pb, const LayerParamIds& w, int64_t layer,
                           LayerSaved& s, const Tensor& d_out);

}  // namespace gale
