// A transformer layer under --enable-mhc-connections (Megatron-Core's HyperConnectionTransformerLayer).
//
// X [Tl, n·H] (n residual streams; global layer 0 first expands its [Tl, H] input to n equal
// streams, the last layer averages them back to [Tl, H] for the final norm):
//   a    = self_attention_hyper_connection.pre(X)          mappings, aggregation (model/hyper_connection.h)
//   y    = linear_proj(attention(input_layernorm(a))) + b  the attention half of the layer
//   X'   = self_attention_hyper_connection.post(y, X)       H_res·X + dropout(H_post ⊗ y)
//   a'   = mlp_hyper_connection.pre(X')
//   y'   = linear_fc2(act(linear_fc1(pre_mlp_layernorm(a')))) + b
//   Xout = mlp_hyper_connection.post(y', X')
// The halves are model/transformer_layer.h's own code (LayerRuntime::mhc_half), which then returns
// the sub-block's output with its bias: no dropout, no residual (the module does both).
#pragma once

#include <cstdint>

#include "model/hyper_connection.h"
#include "model/transformer_layer.h"

namespace gale {

// What an mHC layer keeps beyond the attention half's LayerSaved (which holds this).
struct MhcLayerSaved {
  HyperConnectionSaved attn, mlp;
  LayerSaved mlp_half;
};

Tensor mhc_layer_forward(const LayerRuntime& rt, const ParamBuffer& pb, const LayerParamIds& w, int64_t layer,
                         const Tensor& x_in, LayerSaved* saved);
Tensor mhc_layer_backward(const LayerRuntime& rt, ParamBuffer& pb, const LayerParamIds& w, int64_t layer,
                          LayerSaved& saved, const Tensor& d_out);

}  // namespace gale
