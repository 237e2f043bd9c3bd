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
//
// --recompute-modules mhc (RecomputePlan::mhc; Megatron's CheckpointWithoutOutput around the
// aggregation, the norms and the merge, with one CheckpointWithoutOutputManager per recompute block of
// --mhc-recompute-layer-num layers): forward keeps each module's mappings (proj, r, H_pre, H_post,
// H_res, Sinkhorn's start) and the sub-blocks' outputs y but drops the n-stream inputs X of both
// modules (except the attention module's of a block's first layer, the block's input, which Megatron's
// previous layer keeps because its merge is not checkpointed), the aggregated inputs a and the
// norms' outputs; the backward of a block's last layer first reruns the merges and aggregations of the
// whole block from that input (mhc_recompute_block_forward), and each half's backward then recomputes
// its norm's output from a as --recompute-modules layernorm does. Same kernels on the same values, so
// the gradients are the stored-activation run's, bit for bit.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

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
// The mHC recompute block [first, end) of chunk-local layer i of a chunk of L layers (plan.mhc set).
std::pair<int64_t, int64_t> mhc_recompute_block(const RecomputePlan& plan, int64_t i, int64_t L);

// Rebuilds what forward dropped under --recompute-modules mhc in the chunk-local layers [first, end)
// of `saved` (the chunk's LayerSaved, forward's state; chunk-local 0 is global layer first_layer).
void mhc_recompute_block_forward(const LayerRuntime& rt, int64_t first_layer, int64_t first, int64_t end,
                                 std::vector<LayerSaved>& saved);

Tensor mhc_layer_backward(const LayerRuntime& rt, ParamBuffer& pb, const LayerParamIds& w, int64_t layer,
                          LayerSaved& saved, const Tensor& d_out);

}  // namespace gale
