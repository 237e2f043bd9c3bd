// mHC transformer layer: the two hyper-connection modules around the layer's attention and MLP halves.
#include "model/mhc_layer.h"

#include <algorithm>
#include <memory>

#include "core/check.h"

namespace gale {

namespace {

// The module's dropout over [Tl, n·H] (Megatron's bias-dropout-add on the expanded tensor).
DropoutSpec stream_dropout(const LayerRuntime& rt, int64_t layer, int site) {
  const ModelConfig& c = *rt.config;
  DropoutSpec d;
  d.p = rt.training ? c.hidden_dropout : 0.0f;
  d.seed = c.seed;
  d.stream = dropout_stream(c.seed, layer, site);
  d.row_ids = rt.hidden_row_ids.data();
  d.cols_total = c.mhc.streams * c.hidden;
  return d;
}

LayerRuntime half(const LayerRuntime& rt, int which) {
  LayerRuntime h = rt;
  h.mhc_half = which;
  return h;
}

}  // namespace

Tensor mhc_layer_forward(const LayerRuntime& rt, const ParamBuffer& pb, const LayerParamIds& w, int64_t layer,
                         const Tensor& x_in, LayerSaved* saved) {
  const ModelConfig& c = *rt.config;
  const int64_t n = c.mhc.streams;
  GALE_CHECK(w.hc_attn.defined() && w.hc_mlp.defined()) << "layer " << layer << ": mHC without its modules";
  auto hs = std::make_shared<MhcLayerSaved>();
  const Tensor x = layer == 0 ? hc_expand_forward(x_in, n) : x_in;
  const Tensor a = hc_pre_forward(c, *rt.ops, pb, w.hc_attn, x, &hs->attn);
  const Tensor y = transformer_layer_forward(half(rt, 1), pb, w, layer, a, saved);
  const Tensor x_mid = hc_post_forward(*rt.ops, y, &hs->attn, stream_dropout(rt, layer, 1));
  const Tensor a2 = hc_pre_forward(c, *rt.ops, pb, w.hc_mlp, x_mid, &hs->mlp);
  const Tensor y2 = transformer_layer_forward(half(rt, 2), pb, w, layer, a2, saved ? &hs->mlp_half : nullptr);
  const Tensor out = hc_post_forward(*rt.ops, y2, &hs->mlp, stream_dropout(rt, layer, 2));
  if (saved && c.recompute.mhc) {  // drop what Megatron's output-discarding checkpoints discard (mhc_layer.h)
    const int64_t i = layer - rt.part->first_layer;
    if (i != mhc_recompute_block(c.recompute, i, i + 1).first) hs->attn.x = Tensor();
    hs->mlp.x = Tensor();
    saved->x_in = saved->norm1_out = Tensor();  // a and input_layernorm's output
    hs->mlp_half.x_in = hs->mlp_half.x_mid = hs->mlp_half.norm2_out = Tensor();  // a' and pre_mlp_layernorm's
  }
  if (saved) saved->mhc = hs;
  return layer == c.num_layers - 1 ? hc_contract_forward(out, n) : out;
}

std::pair<int64_t, int64_t> mhc_recompute_block(const RecomputePlan& plan, int64_t i, int64_t L) {
  if (plan.mhc_layer_num <= 0) return {0, L};
  const int64_t first = i / plan.mhc_layer_num * plan.mhc_layer_num;
  return {first, std::min(first + plan.mhc_layer_num, L)};
}

void mhc_recompute_block_forward(const LayerRuntime& rt, int64_t first_layer, int64_t first, int64_t end,
                                 std::vector<LayerSaved>& saved) {
  Tensor x;  // the previous layer's output streams
  for (int64_t i = first; i < end; ++i) {
    const int64_t layer = first_layer + i;
    GALE_CHECK(saved[i].mhc) << "layer " << layer << ": mHC recomputation without its forward's state";
    MhcLayerSaved& hs = *saved[i].mhc;
    if (i == first) {
      GALE_CHECK(hs.attn.x.defined()) << "layer " << layer << ": mHC recompute block without its kept input";
    } else {
      hs.attn.x = x;
    }
    saved[i].x_in = hc_aggregate(hs.attn);
    hs.mlp.x = hc_merge(*rt.ops, hs.attn, stream_dropout(rt, layer, 1));
    hs.mlp_half.x_in = hs.mlp_half.x_mid = hc_aggregate(hs.mlp);
    x = i + 1 < end ? hc_merge(*rt.ops, hs.mlp, stream_dropout(rt, layer, 2)) : Tensor();
  }
}

Tensor mhc_layer_backward(const LayerRuntime& rt, ParamBuffer& pb, const LayerParamIds& w, int64_t layer,
                          LayerSaved& saved, const Tensor& d_out) {
  const ModelConfig& c = *rt.config;
  const int64_t n = c.mhc.streams;
  GALE_CHECK(saved.mhc) << "layer " << layer << ": mHC backward without its forward's state";
  MhcLayerSaved& hs = *saved.mhc;
  const Tensor d = layer == c.num_layers - 1 ? hc_contract_backward(d_out, n) : d_out;
  Tensor d_mid, d_h_post, d_h_res;
  const Tensor d_y2 = hc_post_backward(*rt.ops, hs.mlp, d, stream_dropout(rt, layer, 2), &d_mid, &d_h_post, &d_h_res);
  const Tensor d_a2 = transformer_layer_backward(half(rt, 2), pb, w, layer, hs.mlp_half, d_y2);
  hc_pre_backward(c, *rt.ops, pb, w.hc_mlp, hs.mlp, d_a2, d_h_post, d_h_res, d_mid);
  Tensor d_x;
  const Tensor d_y = hc_post_backward(*rt.ops, hs.attn, d_mid, stream_dropout(rt, layer, 1), &d_x, &d_h_post, &d_h_res);
  const Tensor d_a = transformer_layer_backward(half(rt, 1), pb, w, layer, saved, d_y);
  hc_pre_backward(c, *rt.ops, pb, w.hc_attn, hs.attn, d_a, d_h_post, d_h_res, d_x);
  saved.mhc.reset();
  return layer == 0 ? hc_expand_backward(d_x, n) : d_x;
}

}  // namespace gale
