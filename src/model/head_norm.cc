// --qk-layernorm and --qk-l2-norm forward/backward on packed QKV rows (model/head_norm.h).
#include "model/head_norm.h"

#include <algorithm>

#include "kernels/cpu/head_layout.h"
#include "model/l2_norm.h"
#include "model/norm_weight.h"

namespace gale {

namespace {

int64_t norm_stats_rows(const ModelConfig& c) { return c.rms_norm ? 1 : 2; }

// Copies the `n` heads of `layout` in every row of qkv [T, ·] into rows [T·n, HD] of `heads`
// (back = false), or those rows back into qkv (back = true).
void move_heads(float* qkv, const HeadLayout& layout, int64_t T, int64_t n, int64_t HD, float* heads, bool back) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < n; ++h) {
      float* at = qkv + layout.offset(t, h);
      float* row = heads + (t * n + h) * HD;
      if (back)
        std::copy(row, row + HD, at);
      else
        std::copy(at, at + HD, row);
    }
}

// --qk-layernorm's forward on the `n` heads of `layout` in qkv [T, ·], in place; *pre gets the
// heads before the norm [T·n, HD] and *stats its statistics.
void head_norm_forward(const LayerRuntime& rt, const ParamBuffer& pb, int w, int b, Tensor& qkv,
                       const HeadLayout& layout, int64_t n, Tensor* pre, Tensor* stats) {
  const ModelConfig& c = *rt.config;
  const int64_t T = qkv.size(0), HD = c.head_dim, rows = T * n;
  *pre = Tensor::empty({rows, HD});
  move_heads(qkv.data<float>(), layout, T, n, HD, pre->data<float>(), false);
  Tensor y = Tensor::empty({rows, HD});
  *stats = Tensor::empty({norm_stats_rows(c), rows});
  rt.ops->norm_forward(NormSpec{c.rms_norm, c.norm_eps}, pre->data<float>(), NormScale(c, pb, w).data(),
                       b >= 0 ? pb.param_data(b) : nullptr, y.data<float>(), stats->data<float>(), rows, HD);
  move_heads(qkv.data<float>(), layout, T, n, HD, y.data<float>(), true);
}

// Its backward on d_qkv [T, ·] in place (the heads' gradient after the norm -> before it); the
// weight's (and bias') gradients accumulated; releases pre and stats.
void head_norm_backward(const LayerRuntime& rt, ParamBuffer& pb, int w, int b, Tensor& d_qkv,
                        const HeadLayout& layout, int64_t n, Tensor& pre, Tensor& stats) {
  const ModelConfig& c = *rt.config;
  const int64_t T = d_qkv.size(0), HD = c.head_dim, rows = T * n;
  Tensor dy = Tensor::empty({rows, HD}), dx = Tensor::empty({rows, HD});
  move_heads(d_qkv.data<float>(), layout, T, n, HD, dy.data<float>(), false);
  rt.ops->norm_backward(NormSpec{c.rms_norm, c.norm_eps}, dy.data<float>(), pre.data<float>(), NormScale(c, pb, w).data(),
                        stats.data<float>(), dx.data<float>(), pb.grad_data(w), b >= 0 ? pb.grad_data(b) : nullptr,
                        rows, HD);
  move_heads(d_qkv.data<float>(), layout, T, n, HD, dx.data<float>(), true);
  pre = stats = Tensor();
}

// --qk-l2-norm's forward on the `n` heads of `layout` in qkv [T, ·], in place; *pre gets the heads
// before the norm [T·n, HD] and *inv their scales [T·n].
void head_l2_norm_forward(const ModelConfig& c, Tensor& qkv, const HeadLayout& layout, int64_t n, Tensor* pre,
                          Tensor* inv) {
  const int64_t T = qkv.size(0), HD = c.head_dim, rows = T * n;
  *pre = Tensor::empty({rows, HD});
  move_heads(qkv.data<float>(), layout, T, n, HD, pre->data<float>(), false);
  Tensor y = Tensor::empty({rows, HD});
  *inv = Tensor::empty({rows});
  l2_norm_forward(pre->data<float>(), y.data<float>(), inv->data<float>(), rows, HD, c.norm_eps);
  move_heads(qkv.data<float>(), layout, T, n, HD, y.data<float>(), true);
}

// Its backward on d_qkv [T, ·] in place; releases pre and inv.
void head_l2_norm_backward(const ModelConfig& c, Tensor& d_qkv, const HeadLayout& layout, int64_t n, Tensor& pre,
                           Tensor& inv) {
  const int64_t T = d_qkv.size(0), HD = c.head_dim, rows = T * n;
  Tensor g = Tensor::empty({rows, HD});
  move_heads(d_qkv.data<float>(), layout, T, n, HD, g.data<float>(), false);
  l2_norm_backward(g.data<float>(), pre.data<float>(), inv.data<float>(), g.data<float>(), rows, HD);
  move_heads(d_qkv.data<float>(), layout, T, n, HD, g.data<float>(), true);
  pre = inv = Tensor();
}

}  // namespace

void qk_norm_forward(const LayerRuntime& rt, const ParamBuffer& pb, const LayerParamIds& w, Tensor& qkv, int64_t NH,
                     int64_t KV, LayerSaved* saved) {
  const ModelConfig& c = *rt.config;
  const int64_t HD = c.head_dim;
  Tensor q_pre, k_pre, q_stats, k_stats;
  if (c.qk_l2_norm) {
    head_l2_norm_forward(c, qkv, qkv_query_layout(NH, KV, HD), NH, &q_pre, &q_stats);
    head_l2_norm_forward(c, qkv, qkv_key_layout(NH, KV, HD), KV, &k_pre, &k_stats);
  } else if (w.q_norm_w < 0) {
    return;
  } else {
    head_norm_forward(rt, pb, w.q_norm_w, w.q_norm_b, qkv, qkv_query_layout(NH, KV, HD), NH, &q_pre, &q_stats);
    head_norm_forward(rt, pb, w.k_norm_w, w.k_norm_b, qkv, qkv_key_layout(NH, KV, HD), KV, &k_pre, &k_stats);
  }
  if (saved) {
    saved->q_pre = q_pre;
    saved->k_pre = k_pre;
    saved->q_stats = q_stats;
    saved->k_stats = k_stats;
  }
}

void qk_norm_backward(const LayerRuntime& rt, ParamBuffer& pb, const LayerParamIds& w, Tensor& d_qkv, int64_t NH,
                      int64_t KV, LayerSaved& s) {
  const ModelConfig& c = *rt.config;
  const int64_t HD = c.head_dim;
  if (c.qk_l2_norm) {
    head_l2_norm_backward(c, d_qkv, qkv_query_layout(NH, KV, HD), NH, s.q_pre, s.q_stats);
    head_l2_norm_backward(c, d_qkv, qkv_key_layout(NH, KV, HD), KV, s.k_pre, s.k_stats);
    return;
  }
  if (w.q_norm_w < 0) return;
  head_norm_backward(rt, pb, w.q_norm_w, w.q_norm_b, d_qkv, qkv_query_layout(NH, KV, HD), NH, s.q_pre, s.q_stats);
  head_norm_backward(rt, pb, w.k_norm_w, w.k_norm_b, d_qkv, qkv_key_layout(NH, KV, HD), KV, s.k_pre, s.k_stats);
}

}  // namespace gale
