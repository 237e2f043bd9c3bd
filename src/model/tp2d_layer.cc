// The --tp-2d transformer layer: registration, forward and backward (model/tp2d_layer.h).
#include "model/tp2d_layer.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/norm.h"
#include "model/core_attention.h"
#include "model/head_norm.h"
#include "model/linear.h"
#include "model/mlp_activation.h"
#include "model/norm_weight.h"
#include "model/param_builders.h"
#include "model/tp2d_linear.h"
#include "model/tp2d_norm.h"
#include "parallel/tp2d_mappings.h"

namespace gale {

namespace {

std::string layer_name(int64_t layer, const char* rest) { return str_cat("decoder.layers.", layer, ".", rest); }

// A 1-D parameter kept whole on every TP rank, its gradient summed over TP.
ParamSpec whole_1d(std::string name, int64_t n, InitKind init) {
  ParamSpec s = make_param_spec(std::move(name), {n}, init, 0.0f, false);
  s.sequence_parallel = true;
  return s;
}

// A linear weight [out, in] as 2-D blocks: dimension 0 over `rows` (its parts, this rank's index,
// `blocks` blocks of units of `unit` rows), dimension 1 over `cols`.
ParamSpec block_2d(ParamSpec s, const Communicator& rows, const Communicator& cols, int blocks = 1, int64_t unit = 1) {
  s.gemm_weight = true;
  s.split_dim = 0;
  s.split_blocks = blocks;
  s.split_unit = unit;
  s.split_parts = rows.size();
  s.split_rank = rows.rank();
  s.split2_parts = cols.size();
  s.split2_rank = cols.rank();
  return s;
}

struct Grid {
  Communicator& x;
  Communicator& y;
  int64_t X, Y, xr, yr;
  explicit Grid(const ModelPartition& p)
      : x(*p.tp_x), y(*p.tp_y), X(p.tp_x->size()), Y(p.tp_y->size()), xr(p.tp_x->rank()), yr(p.tp_y->rank()) {}
};

LinearWeight weight(const LayerRuntime& rt, const ParamBuffer& pb, int id) {
  return linear_weight(pb, id, rt.ops->gemm, rt.ops->bf16_gemm);
}

const float* param_or_null(const ParamBuffer& pb, int id, int64_t offset) {
  return id >= 0 ? pb.param_data(id) + offset : nullptr;
}
float* grad_or_null(ParamBuffer& pb, int id, int64_t offset) { return id >= 0 ? pb.grad_data(id) + offset : nullptr; }

// Hidden dropout on this rank's piece: global rows (rt.hidden_row_ids), columns from y·H/Y.
DropoutSpec piece_dropout(const LayerRuntime& rt, const Grid& g, int64_t layer, int site) {
  DropoutSpec d;
  d.p = rt.training ? rt.config->hidden_dropout : 0.0f;
  d.seed = rt.config->seed;
  d.stream = dropout_stream(rt.config->seed, layer, site);
  d.row_ids = rt.hidden_row_ids.data();
  d.cols_total = rt.config->hidden;
  d.col_offset = g.yr * (rt.config->hidden / g.Y);
  return d;
}

Norm2dSpec norm_spec(const ModelConfig& c) { return Norm2dSpec{c.rms_norm, c.norm_eps, c.hidden}; }

// Norm of this rank's piece with its slice of the whole weight (and bias).
Tensor piece_norm_forward(const LayerRuntime& rt, const ParamBuffer& pb, const Grid& g, int w, int b, const Tensor& x,
                          Tensor* stats) {
  const ModelConfig& c = *rt.config;
  const int64_t off = g.yr * (c.hidden / g.Y);
  return norm_2d_forward(norm_spec(c), x, NormScale(c, pb, w).data() + off, param_or_null(pb, b, off), g.y, stats);
}

Tensor piece_norm_backward(const LayerRuntime& rt, ParamBuffer& pb, const Grid& g, int w, int b, const Tensor& dy,
                           const Tensor& x, const Tensor& stats) {
  const ModelConfig& c = *rt.config;
  const int64_t off = g.yr * (c.hidden / g.Y);
  return norm_2d_backward(norm_spec(c), dy, x, stats, NormScale(c, pb, w).data() + off, g.y, pb.grad_data(w) + off,
                          grad_or_null(pb, b, off));
}

// The elements of a whole 1-D bias [blocks·n] that the X-axis rank uses: chunk xr of each block.
std::vector<int64_t> bias_slice(int64_t n_total, int blocks, const Grid& g) {
  const int64_t block = n_total / blocks, part = block / g.X;
  std::vector<int64_t> idx;
  for (int b = 0; b < blocks; ++b)
    for (int64_t i = 0; i < part; ++i) idx.push_back(b * block + g.xr * part + i);
  return idx;
}

// The micro-batch's AttentionProblem (its heads from (x·Y + y)·NHa: GPTModel's runtime) with this
// layer's dropout stream and window.
AttentionProblem piece_attention(const LayerRuntime& rt, int64_t layer) {
  AttentionProblem ap = rt.attention;
  ap.dropout_stream = dropout_stream(rt.config->seed, layer, 0);
  ap.window = rt.config->layer_window(layer);
  return ap;
}

// RoPE's forward or backward (`fn`) on the NHa query and KVa key heads of packed rows [T, (NHa+2KVa)·HD]
// at the micro-batch's positions; nothing without RoPE or in a --no-rope-freq layer.
void rope_heads(const LayerRuntime& rt, int64_t layer, RopeFn fn, Tensor& t, int64_t NHa, int64_t KVa) {
  if (!rt.rope || !rt.config->layer_rope(layer)) return;
  const int64_t B = rt.mb->B, S = rt.mb->S, HD = rt.config->head_dim;
  fn(t.data<float>(), qkv_query_layout(NHa, KVa, HD), NHa, S, B, HD, rt.rope_positions.data(), *rt.rope);
  fn(t.data<float>(), qkv_key_layout(NHa, KVa, HD), KVa, S, B, HD, rt.rope_positions.data(), *rt.rope);
}

}  // namespace

LayerParamIds register_tp2d_layer_params(ParamBuffer& pb, const ModelConfig& c, const ModelPartition& part,
                                         int64_t layer) {
  LayerParamIds w;
  const Grid g(part);
  const int64_t H = c.hidden, HD = c.head_dim;
  const float std = c.init_std;
  const float out_std = c.init_std / std::sqrt(2.0f * static_cast<float>(c.num_layers));
  const int64_t qkv_rows = (c.heads + 2 * c.kv_heads) * HD, qkv_unit = (c.heads / c.kv_heads + 2) * HD;
  const bool ln = !c.rms_norm;
  w.norm1_w = pb.add(whole_1d(layer_name(layer, "input_layernorm.weight"), H, norm_weight_init(c)));
  if (ln) w.norm1_b = pb.add(whole_1d(layer_name(layer, "input_layernorm.bias"), H, InitKind::kZeros));
  // QKV rows are whole query groups: chunk x of them, in units of one group's rows.
  w.qkv_w = pb.add(block_2d(make_param_spec(layer_name(layer, "self_attention.linear_qkv.weight"), {qkv_rows, H},
                                            InitKind::kNormal, std, true),
                            g.x, g.y, 1, qkv_unit));
  if (c.qkv_bias())
    w.qkv_b = pb.add(whole_1d(layer_name(layer, "self_attention.linear_qkv.bias"), qkv_rows, InitKind::kZeros));
  if (c.qk_layernorm) {  // [HD] shared by every head: each rank's heads give a partial gradient
    w.q_norm_w = pb.add(whole_1d(layer_name(layer, "self_attention.q_layernorm.weight"), HD, norm_weight_init(c)));
    if (ln) w.q_norm_b = pb.add(whole_1d(layer_name(layer, "self_attention.q_layernorm.bias"), HD, InitKind::kZeros));
    w.k_norm_w = pb.add(whole_1d(layer_name(layer, "self_attention.k_layernorm.weight"), HD, norm_weight_init(c)));
    if (ln) w.k_norm_b = pb.add(whole_1d(layer_name(layer, "self_attention.k_layernorm.bias"), HD, InitKind::kZeros));
  }
  w.proj_w = pb.add(block_2d(make_param_spec(layer_name(layer, "self_attention.linear_proj.weight"), {H, c.heads * HD},
                                             InitKind::kNormal, out_std, true),
                             g.y, g.x));
  if (c.add_bias_linear)
    w.proj_b = pb.add(whole_1d(layer_name(layer, "self_attention.linear_proj.bias"), H, InitKind::kZeros));
  w.norm2_w = pb.add(whole_1d(layer_name(layer, "pre_mlp_layernorm.weight"), H, norm_weight_init(c)));
  if (ln) w.norm2_b = pb.add(whole_1d(layer_name(layer, "pre_mlp_layernorm.bias"), H, InitKind::kZeros));
  const int blocks = c.gated() ? 2 : 1;  // SwiGLU fc1 holds [gate; up]: each half split over X
  w.fc1_w = pb.add(block_2d(
      make_param_spec(layer_name(layer, "mlp.linear_fc1.weight"), {c.fc1_out(), H}, InitKind::kNormal, std, true), g.x,
      g.y, blocks));
  if (c.add_bias_linear)
    w.fc1_b = pb.add(whole_1d(layer_name(layer, "mlp.linear_fc1.bias"), c.fc1_out(), InitKind::kZeros));
  w.fc2_w = pb.add(block_2d(
      make_param_spec(layer_name(layer, "mlp.linear_fc2.weight"), {H, c.ffn}, InitKind::kNormal, out_std, true), g.y,
      g.x));
  if (c.add_bias_linear) w.fc2_b = pb.add(whole_1d(layer_name(layer, "mlp.linear_fc2.bias"), H, InitKind::kZeros));
  return w;
}

Tensor tp2d_layer_forward(const LayerRuntime& rt, const ParamBuffer& pb, const LayerParamIds& w, int64_t layer,
                          const Tensor& x_in, LayerSaved* saved) {
  const ModelConfig& c = *rt.config;
  const OpTable& ops = *rt.ops;
  const Grid g(*rt.part);
  GALE_CHECK(rt.kv_cache == nullptr) << "--tp-2d: no kv cache";
  const DType gemm_dtype = c.gemm_dtype();
  const int64_t Tl = x_in.size(0), Hl = x_in.size(1);
  const int64_t NHa = c.heads / (g.X * g.Y), KVa = c.kv_heads / (g.X * g.Y);

  // ---- attention block ----
  Tensor norm1_stats, norm1_full;
  Tensor qkv = linear_2d_forward(
      to_gemm_input(piece_norm_forward(rt, pb, g, w.norm1_w, w.norm1_b, x_in, &norm1_stats), gemm_dtype),
      weight(rt, pb, w.qkv_w), g.x, g.y, &norm1_full);  // [T/Y, (NH+2KV)·HD/X]
  if (w.qkv_b >= 0)
    add_bias_ref(qkv.data<float>(), pb.param_data(w.qkv_b) + g.xr * qkv.size(1), qkv.size(0), qkv.size(1));
  Tensor qkv_heads = rows_to_heads(qkv, g.y);  // [T, (NHa+2KVa)·HD]
  qkv = Tensor();
  qk_norm_forward(rt, pb, w, qkv_heads, NHa, KVa, saved);  // --qk-layernorm: on this rank's heads
  rope_heads(rt, layer, ops.rope_forward, qkv_heads, NHa, KVa);
  const AttentionProblem ap = piece_attention(rt, layer);
  Tensor heads_out = core_attention_forward(rt, ap, layer, qkv_heads, saved ? &saved->attention : nullptr);  // [T, NHa·HD]
  qkv_heads = Tensor();
  Tensor ctx_full;
  Tensor proj = linear_2d_forward(to_gemm_input(heads_to_rows(heads_out, g.y), gemm_dtype), weight(rt, pb, w.proj_w),
                                  g.y, g.x, &ctx_full);  // [T/X, H/Y]
  Tensor x_mid = Tensor::empty({Tl, Hl});
  ops.bias_dropout_add(proj.data<float>(), param_or_null(pb, w.proj_b, g.yr * Hl), x_in.data<float>(),
                       x_mid.data<float>(), Tl, Hl, piece_dropout(rt, g, layer, 1));
  proj = Tensor();

  // ---- MLP block ----
  Tensor norm2_stats, norm2_full;
  Tensor fc1_out = linear_2d_forward(
      to_gemm_input(piece_norm_forward(rt, pb, g, w.norm2_w, w.norm2_b, x_mid, &norm2_stats), gemm_dtype),
      weight(rt, pb, w.fc1_w), g.x, g.y, &norm2_full);  // [T/Y, Fin/X]
  const int64_t Ty = fc1_out.size(0), Fl = c.ffn / g.X;
  std::vector<float> fc1_bias;  // this rank's elements of the whole fc1 bias
  if (w.fc1_b >= 0)
    for (int64_t i : bias_slice(c.fc1_out(), c.gated() ? 2 : 1, g)) fc1_bias.push_back(pb.param_data(w.fc1_b)[i]);
  Tensor act = Tensor::empty({Ty, Fl});
  mlp_activation_forward(c, ops)(fc1_out.data<float>(), fc1_bias.empty() ? nullptr : fc1_bias.data(), act.data<float>(),
                                 Ty, Fl);
  Tensor act_full;
  Tensor fc2 = linear_2d_forward(to_gemm_input(act, gemm_dtype), weight(rt, pb, w.fc2_w), g.y, g.x, &act_full);
  act = Tensor();
  Tensor x_out = Tensor::empty({Tl, Hl});
  ops.bias_dropout_add(fc2.data<float>(), param_or_null(pb, w.fc2_b, g.yr * Hl), x_mid.data<float>(),
                       x_out.data<float>(), Tl, Hl, piece_dropout(rt, g, layer, 2));
  if (saved) {
    saved->x_in = x_in;
    saved->norm1_stats = norm1_stats;
    saved->norm1_out = norm1_full;
    saved->heads_out = heads_out;
    saved->ctx = ctx_full;
    saved->x_mid = x_mid;
    saved->norm2_stats = norm2_stats;
    saved->norm2_out = norm2_full;
    saved->fc1_out = fc1_out;
    saved->act = act_full;
  }
  return x_out;
}

Tensor tp2d_layer_backward(const LayerRuntime& rt, ParamBuffer& pb, const LayerParamIds& w, int64_t layer,
                           LayerSaved& s, const Tensor& d_out) {
  const ModelConfig& c = *rt.config;
  const OpTable& ops = *rt.ops;
  const Grid g(*rt.part);
  const int64_t Tl = d_out.size(0), Hl = d_out.size(1);
  const int64_t NHa = c.heads / (g.X * g.Y), KVa = c.kv_heads / (g.X * g.Y);
  GALE_CHECK(s.fc1_out.defined() && s.heads_out.defined())
      << "layer " << layer << ": --tp-2d backward without its forward";

  // ---- MLP block ----
  Tensor d_fc2 = Tensor::empty({Tl, Hl});
  ops.bias_dropout_add_backward(d_out.data<float>(), d_fc2.data<float>(), grad_or_null(pb, w.fc2_b, g.yr * Hl), Tl, Hl,
                                piece_dropout(rt, g, layer, 2));
  Tensor d_act = linear_2d_backward(d_fc2, s.act, weight(rt, pb, w.fc2_w), g.y, g.x);  // [T/Y, F/X]
  d_fc2 = Tensor();
  s.act = Tensor();
  const int64_t Ty = d_act.size(0), Fl = d_act.size(1);
  Tensor d_fc1 = Tensor::empty(s.fc1_out.shape());
  std::vector<int64_t> fc1_bias_idx;
  std::vector<float> d_fc1_bias;
  if (w.fc1_b >= 0) {
    fc1_bias_idx = bias_slice(c.fc1_out(), c.gated() ? 2 : 1, g);
    d_fc1_bias.assign(fc1_bias_idx.size(), 0.0f);
  }
  mlp_activation_backward(c, ops)(d_act.data<float>(), s.fc1_out.data<float>(), d_fc1.data<float>(),
                                  d_fc1_bias.empty() ? nullptr : d_fc1_bias.data(), Ty, Fl);
  for (size_t i = 0; i < fc1_bias_idx.size(); ++i) pb.grad_data(w.fc1_b)[fc1_bias_idx[i]] += d_fc1_bias[i];
  d_act = Tensor();
  s.fc1_out = Tensor();
  Tensor d_norm2 = linear_2d_backward(d_fc1, s.norm2_out, weight(rt, pb, w.fc1_w), g.x, g.y);  // [T/X, H/Y]
  d_fc1 = Tensor();
  s.norm2_out = Tensor();
  Tensor d_x_mid = piece_norm_backward(rt, pb, g, w.norm2_w, w.norm2_b, d_norm2, s.x_mid, s.norm2_stats);
  add_inplace(d_x_mid.data<float>(), d_out.data<float>(), Tl * Hl);  // the residual's gradient
  d_norm2 = Tensor();
  s.x_mid = s.norm2_stats = Tensor();

  // ---- attention block ----
  Tensor d_proj = Tensor::empty({Tl, Hl});
  ops.bias_dropout_add_backward(d_x_mid.data<float>(), d_proj.data<float>(), grad_or_null(pb, w.proj_b, g.yr * Hl), Tl,
                                Hl, piece_dropout(rt, g, layer, 1));
  Tensor d_ctx = rows_to_heads(linear_2d_backward(d_proj, s.ctx, weight(rt, pb, w.proj_w), g.y, g.x), g.y);
  d_proj = Tensor();
  s.ctx = Tensor();
  const AttentionProblem ap = piece_attention(rt, layer);
  Tensor d_heads = core_attention_backward(rt, ap, s.attention, s.heads_out, d_ctx);  // [T, (NHa+2KVa)·HD]
  d_ctx = Tensor();
  s.heads_out = Tensor();
  rope_heads(rt, layer, ops.rope_backward, d_heads, NHa, KVa);
  qk_norm_backward(rt, pb, w, d_heads, NHa, KVa, s);
  Tensor d_qkv = heads_to_rows(d_heads, g.y);  // [T/Y, (NH+2KV)·HD/X]
  d_heads = Tensor();
  if (w.qkv_b >= 0)
    column_sum_accumulate(d_qkv.data<float>(), pb.grad_data(w.qkv_b) + g.xr * d_qkv.size(1), d_qkv.size(0),
                          d_qkv.size(1));
  Tensor d_norm1 = linear_2d_backward(d_qkv, s.norm1_out, weight(rt, pb, w.qkv_w), g.x, g.y);
  d_qkv = Tensor();
  s.norm1_out = Tensor();
  Tensor d_x_in = piece_norm_backward(rt, pb, g, w.norm1_w, w.norm1_b, d_norm1, s.x_in, s.norm1_stats);
  add_inplace(d_x_in.data<float>(), d_x_mid.data<float>(), Tl * Hl);
  s.x_in = s.norm1_stats = Tensor();
  return d_x_in;
}

}  // namespace gale
