// --qk-layernorm / --qk-l2-norm on the packed QKV rows of a layer: every query and key head normalised over
// head_dim (by --normalization) after linear_qkv, before RoPE. Shared by the 1-D layer
// (model/transformer_layer.cc) and the --tp-2d layer (model/tp2d_layer.cc).
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "model/layer_runtime.h"
#include "model/params.h"
#include "model/transformer_layer.h"

namespace gale {

// qkv [T, (NH + 2·KV)·HD] (Megatron's packed layout of NH query heads in KV groups), in place:
// the NH query heads by w.q_norm_w / q_norm_b, the KV key heads by w.k_norm_w / k_norm_b. With
// `saved`, the heads before the norms and their statistics go into saved->q_pre, k_pre, q_stats,
// k_stats. With --qk-l2-norm (ModelConfig::qk_l2_norm) the heads are L2-normalised instead
// (model/l2_norm.h; no weights; q_stats/k_stats keep the per-row scales). Nothing to do (and nothing
// kept) when the layer has neither.
void qk_norm_forward(const LayerRuntime& rt, const ParamBuffer& pb, const LayerParamIds& w, Tensor& qkv, int64_t NH,
                     int64_t KV, LayerSaved* saved);
// Its backward on d_qkv in place (the gradient after the norms -> before them); the norms'
// weight (and bias) gradients accumulated; releases what forward saved.
void qk_norm_backward(const LayerRuntime& rt, ParamBuffer& pb, const LayerParamIds& w, Tensor& d_qkv, int64_t NH,
                      int64_t KV, LayerSaved& s);

}  // namespace gale
