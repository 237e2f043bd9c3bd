// mHC transformer layer: the two hyper-connection modules around the layer's attention and MLP halves.
#include "model/mhc_layer.h"

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
  if (saved) saved->mhc = hs;
  return layer == c.num_layers - 1 ? hc_contract_forward(out, n) : out;
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
