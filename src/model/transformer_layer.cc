// Transformer layer forward/backward: norms, QKV, RoPE, attention, projections, MLP, residuals.
#include "model/transformer_layer.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "core/rng.h"
#include "kernels/flop_counter.h"
#include "model/attention_output_gate.h"
#include "model/document_starts.h"
#include "model/layer_shares.h"
#include "model/head_norm.h"
#include "model/hybrid_layers.h"
#include "model/linear.h"
#include "model/mhc_layer.h"
#include "model/mlp_activation.h"
#include "model/norm_weight.h"
#include "model/param_builders.h"
#include "model/tp2d_layer.h"
#include "model/tp_linear.h"
#include "parallel/mappings.h"

namespace gale {

namespace {

std::string layer_name(int64_t layer, const char* rest) { return str_cat("decoder.layers.", layer, ".", rest); }

ParamSpec norm_weight(const ModelConfig& c, std::string name, int64_t H, const ModelPartition& part) {
  ParamSpec s = make_param_spec(std::move(name), {H}, norm_weight_init(c), 0.0f, false);
  s.sequence_parallel = part.sequence_parallel;
  return s;
}

ParamSpec norm_bias(std::string name, int64_t H, const ModelPartition& part) {
  ParamSpec s = make_param_spec(std::move(name), {H}, InitKind::kZeros, 0.0f, false);
  s.sequence_parallel = part.sequence_parallel;
  return s;
}

int64_t norm_stats_rows(const ModelConfig& c) { return c.rms_norm ? 1 : 2; }

// Parameter `id` of `pb` as a linear layer's weight, on the table's GEMM; its weight gradient
// deferred to rt.weight_grads when backward has one (--dualpipev-dw-detach).
LinearWeight weight(const LayerRuntime& rt, const ParamBuffer& pb, int id) {
  LinearWeight w = linear_weight(pb, id, rt.ops->gemm, rt.ops->bf16_gemm);
  w.defer = rt.weight_grads;
  return w;
}

// A linear layer's output y = x·Wᵀ plus its LoRA branch when `lora` is defined; *u gets x·Aᵀ.
Tensor adapted_linear_forward(const LayerRuntime& rt, const ParamBuffer& pb, int w, const LoraIds& lora,
                              const Tensor& x, Tensor* u) {
  Tensor y = linear_forward(x, weight(rt, pb, w));
  if (lora.defined()) *u = lora_forward(x, lora_weights(pb, lora, rt.config->lora.scaling(), rt.ops->gemm), y);
  return y;
}

// Its backward: dx, with dW (unless frozen), dA and dB accumulated; releases u.
Tensor adapted_linear_backward(const LayerRuntime& rt, ParamBuffer& pb, int w, const LoraIds& lora, const Tensor& dy,
                               const Tensor& x, Tensor& u) {
  Tensor dx = linear_backward(dy, x, weight(rt, pb, w));
  if (lora.defined()) lora_backward(dy, x, u, lora_weights(pb, lora, rt.config->lora.scaling(), rt.ops->gemm), dx);
  u = Tensor();
  return dx;
}

// Norm of [rows, H] x; returns y and fills stats.
Tensor norm_forward(const LayerRuntime& rt, const ParamBuffer& pb, int w, int b, const Tensor& x, Tensor* stats) {
  const ModelConfig& c = *rt.config;
  int64_t rows = x.size(0);
  Tensor y = Tensor::empty(x.shape());
  *stats = Tensor::empty({norm_stats_rows(c), rows});
  rt.ops->norm_forward(NormSpec{c.rms_norm, c.norm_eps}, x.data<float>(), NormScale(c, pb, w).data(),
                       b >= 0 ? pb.param_data(b) : nullptr, y.data<float>(), stats->data<float>(), rows, c.hidden);
  return y;
}

// --post-norm's backward: d of the norm's input [rows, H] from dy; accumulates the weight's (and
// bias's) gradient and releases the saved input and statistics.
Tensor post_norm_backward(const LayerRuntime& rt, ParamBuffer& pb, int w, int b, const Tensor& dy, Tensor& x,
                          Tensor& stats) {
  const ModelConfig& c = *rt.config;
  GALE_CHECK(x.defined() && stats.defined()) << "--post-norm backward without its forward's input";
  const int64_t rows = x.size(0);
  Tensor dx = Tensor::empty(x.shape());
  rt.ops->norm_backward(NormSpec{c.rms_norm, c.norm_eps}, dy.data<float>(), x.data<float>(), NormScale(c, pb, w).data(),
                        stats.data<float>(), dx.data<float>(), pb.grad_data(w), b >= 0 ? pb.grad_data(b) : nullptr,
                        rows, c.hidden);
  x = stats = Tensor();
  return dx;
}

DropoutSpec hidden_dropout(const LayerRuntime& rt, int64_t layer, int site) {
  DropoutSpec d;
  d.p = rt.training && rt.mhc_half == 0 ? rt.config->hidden_dropout : 0.0f;  // mHC: the module's dropout
  d.seed = rt.config->seed;
  d.stream = dropout_stream(rt.config->seed, layer, site);
  d.row_ids = rt.hidden_row_ids.data();
  d.cols_total = rt.config->hidden;
  return d;
}

// Row-parallel output [T, H] partial sums -> [Tl, H] reduced (all-reduce, or reduce-scatter with SP).
Tensor reduce_row_parallel_output(const ModelPartition& part, const Tensor& y) {
  return part.sequence_parallel ? reduce_scatter_to_sequence_parallel_region(y, *part.tp)
                                : reduce_from_tp_region(y, *part.tp);
}

// Its backward: [Tl, H] -> [T, H] (SP all-gather; identity otherwise).
Tensor reduce_row_parallel_output_backward(const ModelPartition& part, const Tensor& dy) {
  return part.sequence_parallel ? reduce_scatter_to_sequence_parallel_region_backward(dy, *part.tp)
                                : reduce_from_tp_region_backward(dy, *part.tp);
}

// Input of a column-parallel linear: [Tl, H] -> [T, H] (SP all-gather; identity otherwise).
Tensor gather_column_parallel_input(const ModelPartition& part, const Tensor& x) {
  return part.sequence_parallel ? gather_from_sequence_parallel_region(x, *part.tp) : copy_to_tp_region(x, *part.tp);
}

// Its backward: [T, H] -> [Tl, H] (SP reduce-scatter; all-reduce otherwise).
Tensor reduce_column_parallel_input_grad(const ModelPartition& part, const Tensor& dx) {
  return part.sequence_parallel ? gather_from_sequence_parallel_region_backward(dx, *part.tp)
                                : copy_to_tp_region_backward(dx, *part.tp);
}

// The TP communication of the layer's linears (--use-ascend-coc chunks, --use-ascend-mc2's
// re-gathered inputs; model/tp_linear.h).
TpLinearComm tp_comm(const LayerRuntime& rt) {
  return TpLinearComm{rt.part->tp.get(), rt.part->sequence_parallel, rt.ops->tp_comm_chunks,
                      rt.ops->tp_regather_input};
}

// A GDN layer's mixer on this rank: its share of the heads, its linears over the layer's TP group,
// its all-to-alls over the cp group.
GdnDims gdn_dims(const LayerRuntime& rt) { return GdnDims::of(*rt.config).tp_local(rt.part->tp_size()); }

GdnWeights gdn_layer_weights(const LayerRuntime& rt, const ParamBuffer& pb, const GdnParamIds& w) {
  GdnWeights m = gdn_weights(*rt.config, pb, w, rt.ops->gemm, rt.ops->bf16_gemm);
  m.tp = tp_comm(rt);
  if (rt.cp_split.cp_size > 1) m.cp = MambaCpComm{rt.part->cp.get(), &rt.cp_split};  // model/gdn_context_parallel.h
  return m;
}

// A norm's output recomputed in backward as the column-parallel linear after it keeps it (GEMM
// input type; SP-gathered unless the linear gathers it again itself).
Tensor norm_output_for_linear(const LayerRuntime& rt, Tensor norm_out) {
  Tensor x = to_gemm_input(norm_out, rt.config->gemm_dtype());
  return tp_comm(rt).keeps_local_input() ? x : gather_column_parallel_input(*rt.part, x);
}

// Whether linear `lora` runs chunked: CoC is on and the linear has no LoRA adapter (refused
// together at start-up; a test's op table may still ask for both).
bool chunked(const LayerRuntime& rt, const LoraIds& lora) { return tp_comm(rt).chunked() && !lora.defined(); }

// Whether a column-parallel linear goes through model/tp_linear.h: chunked, or keeping only this
// rank's input rows (--use-ascend-mc2, refused with LoRA at start-up as norm_output_for_linear
// assumes every column linear does it).
bool tp_linear_column(const LayerRuntime& rt, const LoraIds& lora) {
  GALE_CHECK(!(tp_comm(rt).keeps_local_input() && lora.defined()))
      << "--use-ascend-mc2 with a LoRA adapter on a column-parallel linear";
  return chunked(rt, lora) || tp_comm(rt).keeps_local_input();
}

// A column-parallel linear on this rank's input x (GEMM type): *x_full gets what its backward takes
// (the GEMM's gathered input, or x under --use-ascend-mc2).
Tensor column_linear_forward(const LayerRuntime& rt, const ParamBuffer& pb, int w, const LoraIds& lora,
                             const Tensor& x, Tensor* x_full, Tensor* u) {
  if (tp_linear_column(rt, lora)) return column_parallel_linear_forward(tp_comm(rt), x, weight(rt, pb, w), x_full);
  *x_full = gather_column_parallel_input(*rt.part, x);
  return adapted_linear_forward(rt, pb, w, lora, *x_full, u);
}

// Its backward: this rank's input gradient, reduced over TP.
Tensor column_linear_backward(const LayerRuntime& rt, ParamBuffer& pb, int w, const LoraIds& lora, const Tensor& dy,
                              const Tensor& x_full, Tensor& u) {
  if (tp_linear_column(rt, lora)) return column_parallel_linear_backward(tp_comm(rt), dy, x_full, weight(rt, pb, w));
  return reduce_column_parallel_input_grad(*rt.part, adapted_linear_backward(rt, pb, w, lora, dy, x_full, u));
}

// A row-parallel linear: [T, in] -> [Tl, H] reduced.
Tensor row_linear_forward(const LayerRuntime& rt, const ParamBuffer& pb, int w, const LoraIds& lora, const Tensor& x,
                          Tensor* u) {
  if (chunked(rt, lora)) return row_parallel_linear_forward(tp_comm(rt), x, weight(rt, pb, w));
  return reduce_row_parallel_output(*rt.part, adapted_linear_forward(rt, pb, w, lora, x, u));
}

// Its backward from this rank's output gradient dy [Tl, H]: dx [T, in].
Tensor row_linear_backward(const LayerRuntime& rt, ParamBuffer& pb, int w, const LoraIds& lora, const Tensor& dy,
                           const Tensor& x, Tensor& u) {
  if (chunked(rt, lora)) return row_parallel_linear_backward(tp_comm(rt), dy, x, weight(rt, pb, w));
  return adapted_linear_backward(rt, pb, w, lora, reduce_row_parallel_output_backward(*rt.part, dy), x, u);
}

// The MLP activation of u = fc1's output with its bias already added (as forward left it), as the
// fc2 GEMM takes it. Forward adds the bias in the same call; with it already in u this is the same
// arithmetic on the same values.
Tensor activation_forward(const LayerRuntime& rt, float* u, const float* bias, int64_t T, int64_t Fl) {
  Tensor act = Tensor::empty({T, Fl});
  mlp_activation_forward(*rt.config, *rt.ops)(u, bias, act.data<float>(), T, Fl);
  return to_gemm_input(act, rt.config->gemm_dtype());
}

// The MoE router's key of global layer `layer`: its input jitter's and training (model/moe_router.h).
MoeRouterKey moe_router_key(const LayerRuntime& rt, int64_t layer) {
  MoeRouterKey key{layer, rt.hidden_row_ids.empty() ? nullptr : rt.hidden_row_ids.data(), rt.training};
  key.per_token_loss = rt.per_token_loss;
  return key;
}

// Whether layer `layer` of this chunk recomputes what `plan_layers` (a RecomputePlan count) names.
bool recomputes(const LayerRuntime& rt, int64_t layer, int64_t plan_layers) {
  return layer - rt.part->first_layer < plan_layers;
}

// The --moe-zero-memory level of layer `layer` of this chunk: level1 in the chunk's first
// --moe-zero-memory-num-layers layers, level0 in the others.
MoeZeroMemory moe_zero_memory(const LayerRuntime& rt, int64_t layer) {
  const RecomputePlan& r = rt.config->recompute;
  if (r.moe_zero_memory == MoeZeroMemory::kLevel1 && !recomputes(rt, layer, r.moe_zero_memory_level1_layers))
    return MoeZeroMemory::kLevel0;
  return r.moe_zero_memory;
}

// Whether the MoE shared expert runs while the routed rows' exchange is in flight
// (--moe-shared-expert-overlap, --moe-alltoall-overlap-comm or --moe-allgather-overlap-comm).
bool overlaps_shared_expert(const LayerRuntime& rt) {
  return rt.config->moe.shared_overlap || rt.ops->moe_alltoall_overlap || rt.ops->moe_allgather_overlap;
}

// --is-hybrid-model (model/hybrid_layers.h): an attention layer ('*') or a Gated DeltaNet layer ('G')
// has no MLP, an MLP layer ('-') or a MoE layer ('E') no attention; every other layer (and a GPT model's) has both.
bool has_attention(const ModelConfig& c, int64_t layer) {
  if (c.attention_kind(layer) == SubBlock::kNoOp) return false;  // a heterogeneous layer's no_op attention
  if (!c.hybrid.enabled) return true;
  const char kind = c.hybrid.kind(layer);
  return kind != kHybridMlp && kind != kHybridMoe;
}
bool has_mlp(const ModelConfig& c, int64_t layer) {
  if (c.mlp_kind(layer) == SubBlock::kNoOp) return false;
  if (!c.hybrid.enabled) return true;
  const char kind = c.hybrid.kind(layer);
  return kind != kHybridAttention && kind != kHybridMla && kind != kHybridGatedDeltaNet;
}

// A heterogeneous layer's linear replacement (SubBlock::kLinear, Megatron's
// ColumnParallelLinearGathered): W [H, H] column-parallel on this rank's norm output x [Tl, H] (GEMM
// type), its bias added to this rank's H/TP columns, the columns all-gathered over TP and, with
// sequence parallelism, this rank's rows kept: returns [Tl, H]; *x_full gets what backward takes.
Tensor linear_replacement_forward(const LayerRuntime& rt, const ParamBuffer& pb, int w, int b, const Tensor& x,
                                  Tensor* x_full) {
  Tensor u;
  Tensor y = column_linear_forward(rt, pb, w, LoraIds{}, x, x_full, &u);  // [T, H/TP]
  if (b >= 0) add_bias_ref(y.data<float>(), pb.param_data(b), y.size(0), y.size(1));
  const ModelPartition& part = *rt.part;
  Tensor full = gather_from_tp_region(y, *part.tp);  // [T, H]
  return part.sequence_parallel ? scatter_to_sequence_parallel_region(full, *part.tp) : full;
}

// Its backward from dy [Tl, H]: this rank's input gradient [Tl, H] (reduced over TP); dW and db accumulated.
Tensor linear_replacement_backward(const LayerRuntime& rt, ParamBuffer& pb, int w, int b, const Tensor& dy,
                                   const Tensor& x_full) {
  const ModelPartition& part = *rt.part;
  const Tensor d_full = part.sequence_parallel ? scatter_to_sequence_parallel_region_backward(dy, *part.tp) : dy;
  const Tensor d_y = gather_from_tp_region_backward(d_full, *part.tp);  // [T, H/TP]
  if (b >= 0) column_sum_accumulate(d_y.data<float>(), pb.grad_data(b), d_y.size(0), d_y.size(1));
  Tensor u;
  return column_linear_backward(rt, pb, w, LoraIds{}, d_y, x_full, u);
}

// Registers a linear replacement's W [H, H] (split by output rows) and bias under `prefix`.
void register_linear_replacement(ParamBuffer& pb, const ModelConfig& c, const ModelPartition& part, int64_t layer,
                                 const char* prefix, int* w, int* b) {
  const int64_t H = c.hidden;
  *w = pb.add(tp_split(gemm_weight(make_param_spec(layer_name(layer, str_cat(prefix, "weight").c_str()), {H, H},
                                                   InitKind::kNormal, c.init_std, true)),
                       part, 0));
  if (c.add_bias_linear)
    *b = pb.add(tp_split(make_param_spec(layer_name(layer, str_cat(prefix, "bias").c_str()), {H}, InitKind::kZeros, 0,
                                         false),
                         part, 0));
}

// --softmax-type learnable: points ap.softmax_offset (and *grad, when asked) at the heads attention
// runs on, this TP rank's softmax_offset from the head split's first head (Ulysses: this cp rank's
// heads). Off-by-one's zeros are already in ap (GPTModel's runtime); vanilla leaves it null.
void set_softmax_offset(const LayerRuntime& rt, const ParamBuffer& pb, const LayerParamIds& w, AttentionProblem* ap,
                        float** grad) {
  if (w.softmax_offset < 0) return;
  const int64_t first = ap->head_offset - layer_shares(*rt.config, *rt.part).head_offset;
  ap->softmax_offset = pb.param_data(w.softmax_offset) + first;
  if (grad) *grad = pb.grad_data(w.softmax_offset) + first;
}

}  // namespace

uint64_t dropout_stream(uint64_t seed, int64_t layer, int site) {
  return mix_stream(seed, 0xD7, static_cast<uint64_t>(layer + 1), static_cast<uint64_t>(site));
}

std::vector<int> LayerParamIds::all() const {
  std::vector<int> ids;
  for (int id : {norm1_w, norm1_b, linear_attn_w, linear_attn_b, qkv_w, qkv_b, q_norm_w, q_norm_b, k_norm_w, k_norm_b,
                 softmax_offset, proj_w, proj_b, post_attn_norm_w, post_attn_norm_b, norm2_w, norm2_b, linear_mlp_w,
                 linear_mlp_b, fc1_w, fc1_b, fc2_w, fc2_b})
    if (id >= 0) ids.push_back(id);
  for (int id : moe.all()) ids.push_back(id);
  for (int id : shared.all()) ids.push_back(id);
  for (int id : {post_mlp_norm_w, post_mlp_norm_b})  // --post-norm: registered after the MLP (dense or MoE)
    if (id >= 0) ids.push_back(id);
  for (int id : mla.all()) ids.push_back(id);
  for (int id : mamba.all()) ids.push_back(id);
  for (int id : gdn.all()) ids.push_back(id);
  for (const HyperConnectionIds& h : {hc_attn, hc_mlp})
    for (int id : {h.mapping_proj, h.alpha_pre, h.alpha_post, h.alpha_res, h.bias})
      if (id >= 0) ids.push_back(id);
  for (const LoraIds& l : {lora_qkv, lora_proj, lora_fc1, lora_fc2})
    if (l.defined()) {
      ids.push_back(l.a);
      ids.push_back(l.b);
    }
  return ids;
}

LayerParamIds register_layer_params(ParamBuffer& pb, const ModelConfig& c, const ModelPartition& part, int64_t layer) {
  LayerParamIds w;
  if (c.is_noop_layer(layer)) return w;  // the identity: no parameters
  if (c.hybrid.is_mamba_layer(layer)) {
    w.mamba = register_mamba_params(pb, c, layer, &part);
    return w;
  }
  if (part.tp2d()) return register_tp2d_layer_params(pb, c, part, layer);
  if (c.layer_differs(layer)) return register_layer_params(pb, c.for_layer(layer), part, layer);  // its own sizes
  const int64_t H = c.hidden, HD = c.head_dim;
  const float std = c.init_std;
  const float out_std = c.init_std / std::sqrt(2.0f * static_cast<float>(c.num_layers));
  const int64_t qkv_rows = ((c.attention_output_gate ? 2 : 1) * c.heads + 2 * c.kv_heads) * HD;  // + the gates
  const bool ln = !c.rms_norm;
  const LayerShares shares = layer_shares(c, part);
  // A hybrid model's norms are named as Megatron's Mamba spec fuses them (TELayerNormColumnParallelLinear),
  // and so are a GDN model's (Megatron builds it with Transformer Engine's spec only).
  // A hybrid model's multi-latent attention layer ('+') keeps input_layernorm (Megatron's mla_layer
  // spec: TENorm, then MLASelfAttention).
  const bool hybrid = (c.hybrid.enabled && c.hybrid.kind(layer) != kHybridMla) || c.gdn.enabled;
  if (c.gdn.is_gdn_layer(layer)) {  // the GDN mixer in place of self-attention, its norm fused into in_proj
    w.norm1_w = pb.add(norm_weight(c, layer_name(layer, "self_attention.in_proj.layer_norm_weight"), H, part));
    if (ln) w.norm1_b = pb.add(norm_bias(layer_name(layer, "self_attention.in_proj.layer_norm_bias"), H, part));
    w.gdn = register_gdn_params(pb, c, layer, &part);
  } else if (has_attention(c, layer)) {
    if (c.mhc.enabled)
      w.hc_attn = register_hyper_connection_params(pb, c, part, layer_name(layer, "self_attention_hyper_connection"));
    w.norm1_w = pb.add(norm_weight(c, layer_name(layer, hybrid ? "self_attention.linear_qkv.layer_norm_weight" : "input_layernorm.weight"), H, part));
    if (ln) w.norm1_b = pb.add(norm_bias(layer_name(layer, hybrid ? "self_attention.linear_qkv.layer_norm_bias" : "input_layernorm.bias"), H, part));
    if (c.attention_kind(layer) == SubBlock::kLinear) {
      register_linear_replacement(pb, c, part, layer, "self_attention.", &w.linear_attn_w, &w.linear_attn_b);
    } else {
      if (c.mla.enabled) {
        w.mla = register_mla_params(pb, c, part, layer);
        if (c.mla.down_proj_fusion) {  // the input norm runs inside MLA, fused with the down projections
          w.mla.input_norm_w = w.norm1_w;
          w.mla.input_norm_b = w.norm1_b;
        }
      } else {
        // QKV rows are whole KV groups, so a contiguous split of dim 0 in units of one group's rows
        // gives each TP rank its groups (model/layer_shares.h).
        w.qkv_w = pb.add(tp_split(gemm_weight(make_param_spec(layer_name(layer, "self_attention.linear_qkv.weight"), {qkv_rows, H}, InitKind::kNormal, std, true)), part, 0, 1, shares.qkv_rows_per_group));
        if (lora_targets(c.lora, LoraTarget::kQkv))
          w.lora_qkv = register_lora_params(pb, c.lora, part, layer_name(layer, "self_attention.linear_qkv.weight"), qkv_rows, H,
                                             LoraSplit::kColumn);
        if (c.qkv_bias())
          w.qkv_b = pb.add(tp_split(make_param_spec(layer_name(layer, "self_attention.linear_qkv.bias"), {qkv_rows}, InitKind::kZeros, 0, false), part, 0, 1, shares.qkv_rows_per_group));
        if (c.qk_layernorm) {  // [HD] shared by every head: each TP rank's heads give a partial gradient
          auto head_norm = [&](const char* name, InitKind init) {
            ParamSpec s = make_param_spec(layer_name(layer, name), {HD}, init, 0.0f, false);
            s.sequence_parallel = part.tp_size() > 1;
            return pb.add(s);
          };
          w.q_norm_w = head_norm("self_attention.q_layernorm.weight", norm_weight_init(c));
          if (ln) w.q_norm_b = head_norm("self_attention.q_layernorm.bias", InitKind::kZeros);
          w.k_norm_w = head_norm("self_attention.k_layernorm.weight", norm_weight_init(c));
          if (ln) w.k_norm_b = head_norm("self_attention.k_layernorm.bias", InitKind::kZeros);
        }
        // --softmax-type learnable: one sink logit per query head, Megatron's init_method (normal,
        // --init-method-std), no weight decay (1-D); split over TP in units of one group's heads.
        if (c.softmax_type == SoftmaxType::kLearnable)
          w.softmax_offset = pb.add(tp_split(make_param_spec(layer_name(layer, "self_attention.core_attention.softmax_offset"),
                                                             {c.heads}, InitKind::kNormal, std, false),
                                             part, 0, 1, c.heads / c.kv_heads));
      }
      const int64_t attn_out = c.heads * (c.mla.enabled ? c.mla.v_head_dim : HD);  // linear_proj's input width
      // Its columns are the heads' outputs: split in units of one group's heads (MLA: one head's Dv).
      const int64_t proj_unit = c.mla.enabled ? c.mla.v_head_dim : shares.proj_cols_per_group;
      w.proj_w = pb.add(tp_split(gemm_weight(make_param_spec(layer_name(layer, "self_attention.linear_proj.weight"), {H, attn_out}, InitKind::kNormal, out_std, true)), part, 1, 1, proj_unit));
      if (lora_targets(c.lora, LoraTarget::kProj))
        w.lora_proj = register_lora_params(pb, c.lora, part, layer_name(layer, "self_attention.linear_proj.weight"), H,
                                            attn_out, LoraSplit::kRow);
      if (c.add_bias_linear) {
        ParamSpec b = make_param_spec(layer_name(layer, "self_attention.linear_proj.bias"), {H}, InitKind::kZeros, 0, false);
        b.sequence_parallel = part.sequence_parallel;
        w.proj_b = pb.add(b);
      }
      if (c.post_norm) {  // --post-norm: Gemma-2's norm of the attention output (MindSpeed-LLM's post_attn_norm)
        w.post_attn_norm_w = pb.add(norm_weight(c, layer_name(layer, "post_attn_norm.weight"), H, part));
        if (ln) w.post_attn_norm_b = pb.add(norm_bias(layer_name(layer, "post_attn_norm.bias"), H, part));
      }
    }
  }
  if (!has_mlp(c, layer)) return w;
  // A MoE MLP has no linear_fc1 to fuse its norm into: Transformer Engine's spec keeps pre_mlp_layernorm
  // (a hybrid model's 'E' layers, Megatron's moe_layer spec).
  const bool fused_norm2 = hybrid && !c.moe.is_moe_layer(layer);
  if (c.mhc.enabled) w.hc_mlp = register_hyper_connection_params(pb, c, part, layer_name(layer, "mlp_hyper_connection"));
  w.norm2_w = pb.add(norm_weight(c, layer_name(layer, fused_norm2 ? "mlp.linear_fc1.layer_norm_weight" : "pre_mlp_layernorm.weight"), H, part));
  if (ln) w.norm2_b = pb.add(norm_bias(layer_name(layer, fused_norm2 ? "mlp.linear_fc1.layer_norm_bias" : "pre_mlp_layernorm.bias"), H, part));
  if (c.mlp_kind(layer) == SubBlock::kLinear) {
    register_linear_replacement(pb, c, part, layer, "mlp.", &w.linear_mlp_w, &w.linear_mlp_b);
    return w;
  }
  if (c.moe.is_moe_layer(layer)) {
    GALE_CHECK(part.tp_size() == 1 || part.sequence_parallel) << "MoE layers with TP need sequence parallelism";
    const int64_t etp = part.etp ? part.etp->size() : 1, etp_rank = part.etp ? part.etp->rank() : 0;
    // Under TP the router's gradient is partial per TP rank (its own tokens), and so are whole
    // experts' replicated on every TP rank (--expert-tensor-parallel-size 1 without EP): both
    // all-reduced over TP. Under EP the experts are reduced over expert-DP only (Megatron): with
    // expert TP 1 the TP ranks then hold different experts.
    w.moe = register_moe_params(pb, c, layer, part.ep_size(), part.ep_rank(), etp, etp_rank, part.tp_size() > 1,
                                part.tp_size() > 1 && etp == 1 && part.ep_size() == 1);
    if (c.moe.global_aux_loss_coeff > 0.0) w.moe.global_aux = std::make_shared<MoeGlobalAux>(c.moe.num_experts, part.moe_global_aux);
    w.shared = register_shared_expert_params(pb, c, part, layer);
    if (c.post_norm) {  // --post-norm: the MoE output's norm
      w.post_mlp_norm_w = pb.add(norm_weight(c, layer_name(layer, "post_mlp_layernorm.weight"), H, part));
      if (ln) w.post_mlp_norm_b = pb.add(norm_bias(layer_name(layer, "post_mlp_layernorm.bias"), H, part));
    }
    return w;
  }
  // SwiGLU fc1 holds [gate; up]: each half is split across TP ranks (2 blocks).
  int blocks = c.gated() ? 2 : 1;
  w.fc1_w = pb.add(tp_split(gemm_weight(make_param_spec(layer_name(layer, "mlp.linear_fc1.weight"), {c.fc1_out(), H}, InitKind::kNormal, std, true)), part, 0, blocks));
  if (lora_targets(c.lora, LoraTarget::kFc1))
    w.lora_fc1 = register_lora_params(pb, c.lora, part, layer_name(layer, "mlp.linear_fc1.weight"), c.fc1_out(), H,
                                       LoraSplit::kColumn, blocks);
  if (c.add_bias_linear)
    w.fc1_b = pb.add(tp_split(make_param_spec(layer_name(layer, "mlp.linear_fc1.bias"), {c.fc1_out()}, InitKind::kZeros, 0, false), part, 0, blocks));
  w.fc2_w = pb.add(tp_split(gemm_weight(make_param_spec(layer_name(layer, "mlp.linear_fc2.weight"), {H, c.ffn}, InitKind::kNormal, out_std, true)), part, 1));
  if (lora_targets(c.lora, LoraTarget::kFc2))
    w.lora_fc2 = register_lora_params(pb, c.lora, part, layer_name(layer, "mlp.linear_fc2.weight"), H, c.ffn,
                                       LoraSplit::kRow);
  if (c.add_bias_linear) {
    ParamSpec b = make_param_spec(layer_name(layer, "mlp.linear_fc2.bias"), {H}, InitKind::kZeros, 0, false);
    b.sequence_parallel = part.sequence_parallel;
    w.fc2_b = pb.add(b);
  }
  if (c.post_norm) {  // --post-norm: Gemma-2's norm of the MLP output (MindSpeed-LLM's post_mlp_layernorm)
    w.post_mlp_norm_w = pb.add(norm_weight(c, layer_name(layer, "post_mlp_layernorm.weight"), H, part));
    if (ln) w.post_mlp_norm_b = pb.add(norm_bias(layer_name(layer, "post_mlp_layernorm.bias"), H, part));
  }
  return w;
}

namespace {

// The attention problem of a heterogeneous layer (config `lc`, ModelConfig::for_layer): this TP
// rank's heads and groups of the layer (uneven under --unaligned-linear, so the heads and their
// offset differ from the flags' too), then, as GptModel does for the flags' layer, 1/D of them under
// a Ulysses head split (ulysses_cp_algo, hybrid_cp_algo's Ulysses sub-group of degree D).
AttentionProblem layer_attention_problem(const LayerRuntime& rt, const ModelConfig& lc) {
  AttentionProblem ap = rt.attention;
  const ModelPartition& part = *rt.part;
  const LayerShares shares = layer_shares(lc, part);
  ap.NH = shares.heads;
  ap.KV = shares.groups;
  ap.head_offset = shares.head_offset;
  if (rt.cp_split.cp_size <= 1) return ap;
  if (part.hybrid_cp()) {
    const int64_t U = part.cp_hybrid.ulysses_degree();
    ap.NH /= U;
    ap.KV = ulysses_kv_heads(ap.KV, U);
    ap.head_offset += (part.cp_rank() % U) * ap.NH;
  } else if (part.cp_ulysses) {
    ap.NH /= rt.cp_split.cp_size;
    ap.KV = part.cp_ulysses_allgather_kv ? ap.KV : ulysses_kv_heads(ap.KV, rt.cp_split.cp_size);
    ap.head_offset += part.cp_rank() * ap.NH;
  }
  return ap;
}

}  // namespace

Tensor transformer_layer_forward(const LayerRuntime& rt, const ParamBuffer& pb, const LayerParamIds& w, int64_t layer,
                                 const Tensor& x_in, LayerSaved* saved) {
  const ModelConfig& c = *rt.config;
  if (c.is_noop_layer(layer)) return x_in;  // --noop-layers: nothing to compute or keep
  if (c.mhc.enabled && rt.mhc_half == 0) return mhc_layer_forward(rt, pb, w, layer, x_in, saved);
  if (w.mamba.defined()) return mamba_layer_forward(rt, pb, w.mamba, layer, x_in, saved ? &saved->mamba : nullptr);
  if (rt.part->tp2d()) return tp2d_layer_forward(rt, pb, w, layer, x_in, saved);
  if (!has_attention(c, layer) && !has_mlp(c, layer)) return x_in;  // heterogeneous: both sub-blocks no_op
  if (c.layer_differs(layer)) {  // a heterogeneous layer's own query groups / FFN size
    const ModelConfig lc = c.for_layer(layer);
    LayerRuntime lrt = rt;
    lrt.config = &lc;
    lrt.attention = layer_attention_problem(rt, lc);
    return transformer_layer_forward(lrt, pb, w, layer, x_in, saved);
  }
  const ModelPartition& part = *rt.part;
  const OpTable& ops = *rt.ops;
  const LayerShares shares = layer_shares(c, part);
  const int64_t NHl = shares.heads, KVl = shares.groups, HD = c.head_dim, Fl = shares.ffn;
  const int64_t B = rt.mb->B, S = rt.mb->S, T = S * B, Tl = x_in.size(0), H = c.hidden;

  // ---- attention block ----
  Tensor norm1_stats;
  const DType gemm_dtype = c.gemm_dtype();
  Tensor u_qkv, u_proj, u_fc1, u_fc2;  // LoRA's x·Aᵀ per adapted linear
  const bool attn = has_attention(c, layer) && rt.mhc_half != 2, mlp = has_mlp(c, layer) && rt.mhc_half != 1;
  Tensor norm1_out, ctx, x_mid, norm2_stats, norm2_local;
  if (!attn) {  // a hybrid model's MLP or MoE layer ('-', 'E'): its norm on the input, no residual before it
    x_mid = x_in;
    norm2_local = norm_forward(rt, pb, w.norm2_w, w.norm2_b, x_in, &norm2_stats);
  } else {
    Tensor proj;
    if (w.gdn.defined()) {  // the GDN mixer in attention's place: [Tl, H] of norm1's output, heads split over TP
      Tensor x_norm = to_gemm_input(norm_forward(rt, pb, w.norm1_w, w.norm1_b, x_in, &norm1_stats), gemm_dtype);
      const GdnWeights gw = gdn_layer_weights(rt, pb, w.gdn);
      std::vector<GdnSequence> seqs;  // decoding: each sample's or request's rows with its state
      for (const RecurrentRows& r : recurrent_decoding_rows(rt.kv_cache, rt.ragged_kv, B, S, layer - part.first_layer))
        seqs.push_back(GdnSequence{r.first, r.stride, r.length, r.conv, r.ssm, r.conv_steps, r.ssm_steps});
      proj = seqs.empty() ? gdn_forward(gdn_dims(rt), gw, x_norm, S, B, gemm_dtype, saved ? &saved->gdn : nullptr,
                                        scan_document_starts(*rt.mb))
                          : gdn_forward_sequences(gdn_dims(rt), gw, x_norm, seqs, gemm_dtype);
    } else if (w.linear_attn_w >= 0) {  // a heterogeneous layer's linear replacement: norm1, W (bias inside)
      const Tensor x_norm = to_gemm_input(norm_forward(rt, pb, w.norm1_w, w.norm1_b, x_in, &norm1_stats), gemm_dtype);
      proj = linear_replacement_forward(rt, pb, w.linear_attn_w, w.linear_attn_b, x_norm, &norm1_out);  // [Tl, H]
    } else {
      AttentionProblem ap = rt.attention;
      ap.dropout_stream = dropout_stream(c.seed, layer, 0);
      ap.window = c.layer_window(layer);  // --window-attn-skip-freq: this layer's window or none
      Tensor* cache = rt.kv_cache ? &rt.kv_cache->layers.at(layer - part.first_layer) : nullptr;
      if (w.mla.defined()) {  // MLA takes norm1's output on this rank's tokens (model/mla_attention.h)
        Tensor x_norm = mla_down_proj_fused(rt, w.mla)  // --mla-down-proj-fusion: MLA norms x_in itself
                            ? x_in
                            : to_gemm_input(norm_forward(rt, pb, w.norm1_w, w.norm1_b, x_in, &norm1_stats), gemm_dtype);
        ctx = mla_attention_forward(rt, pb, w.mla, ap, layer, x_norm, cache, saved ? &saved->mla : nullptr);  // [T, NHl·Dv]
      } else {
        const Tensor x_norm = to_gemm_input(norm_forward(rt, pb, w.norm1_w, w.norm1_b, x_in, &norm1_stats), gemm_dtype);
        Tensor qkv = column_linear_forward(rt, pb, w.qkv_w, w.lora_qkv, x_norm, &norm1_out, &u_qkv);  // [T, (NHl+2KVl)·HD]
        if (w.qkv_b >= 0) add_bias_ref(qkv.data<float>(), pb.param_data(w.qkv_b), T, qkv.size(1));
        Tensor gate;  // --attention-output-gate: [T, NHl·HD], out of the packed rows
        if (c.attention_output_gate) qkv = split_output_gate(qkv, NHl, KVl, HD, &gate);
        const HeadLayout ql = qkv_query_layout(NHl, KVl, HD), kl = qkv_key_layout(NHl, KVl, HD);
        qk_norm_forward(rt, pb, w, qkv, NHl, KVl, saved);  // --qk-layernorm: per-head norms before RoPE
        if (rt.rope && c.layer_rope(layer)) {
          ops.rope_forward(qkv.data<float>(), ql, NHl, S, B, HD, rt.rope_positions.data(), *rt.rope);
          ops.rope_forward(qkv.data<float>(), kl, KVl, S, B, HD, rt.rope_positions.data(), *rt.rope);
        }
        CoreAttentionSaved* attention_saved = saved ? &saved->attention : nullptr;
        set_softmax_offset(rt, pb, w, &ap, nullptr);
        ctx = rt.ragged_kv ? ragged_attention_forward(rt, ap, qkv, layer - part.first_layer)
              : cache      ? cached_attention_forward(rt, ap, qkv, *cache)
                           : core_attention_forward(rt, ap, layer, qkv, attention_saved);  // [T, NHl·HD]
        if (gate.defined()) {  // ctx ⊙ σ(gate); backward needs both
          Tensor gated = Tensor::empty(ctx.shape());
          output_gate_forward(ctx.data<float>(), gate.data<float>(), gated.data<float>(), ctx.numel());
          if (saved) {
            saved->gate = gate;
            saved->ctx_ungated = ctx;
          }
          ctx = gated;
        }
      }
      ctx = to_gemm_input(ctx, gemm_dtype);
      proj = row_linear_forward(rt, pb, w.proj_w, w.lora_proj, ctx, &u_proj);  // [Tl, H]
    }
    if (w.post_attn_norm_w >= 0) {  // --post-norm: the attention output normalised before its bias and the residual
      Tensor stats;
      Tensor normed = norm_forward(rt, pb, w.post_attn_norm_w, w.post_attn_norm_b, proj, &stats);
      if (saved) {
        saved->post_attn_in = proj;
        saved->post_attn_stats = stats;
      }
      proj = normed;
    }
    // x_mid = x_in + dropout(proj + b_proj), and norm2 of it, in one pass.
    x_mid = Tensor::empty({Tl, H});
    if (rt.mhc_half != 0) {  // mHC's attention half: the output with its bias (model/mhc_layer.h)
      if (w.proj_b >= 0) add_bias_ref(proj.data<float>(), pb.param_data(w.proj_b), Tl, H);
      x_mid = proj;
    } else if (!mlp) {  // a hybrid model's attention layer ('*'): the residual add alone
      ops.bias_dropout_add(proj.data<float>(), w.proj_b >= 0 ? pb.param_data(w.proj_b) : nullptr, x_in.data<float>(),
                           x_mid.data<float>(), Tl, H, hidden_dropout(rt, layer, 1));
    } else {
      norm2_stats = Tensor::empty({norm_stats_rows(c), Tl});
      norm2_local = Tensor::empty({Tl, H});
      ops.bias_dropout_add_norm(proj.data<float>(), w.proj_b >= 0 ? pb.param_data(w.proj_b) : nullptr,
                                x_in.data<float>(), x_mid.data<float>(), NormSpec{c.rms_norm, c.norm_eps},
                                NormScale(c, pb, w.norm2_w).data(), w.norm2_b >= 0 ? pb.param_data(w.norm2_b) : nullptr,
                                norm2_local.data<float>(), norm2_stats.data<float>(), Tl, H, hidden_dropout(rt, layer, 1));
    }
    proj = Tensor();
  }
  if (!mlp) {
    if (saved) {
      saved->x_in = x_in;
      saved->norm1_stats = norm1_stats;
      saved->norm1_out = !recomputes(rt, layer, c.recompute.norm_layers) ? norm1_out : Tensor();
      saved->ctx = ctx;
      saved->lora_qkv_u = u_qkv;
      saved->lora_proj_u = u_proj;
    }
    return x_mid;
  }

  // ---- MLP block ----
  // The MoE MLP routes this rank's own tokens [Tl, H] (no sequence-parallel all-gather).
  Tensor mlp_in = to_gemm_input(norm2_local, gemm_dtype);  // [Tl, H]
  norm2_local = Tensor();
  Tensor norm2_out = w.moe.defined() ? mlp_in : Tensor();  // dense: the gathered input, from fc1
  Tensor fc1_out, act, fc2;
  // --recompute-modules: what reruns in backward (config.h RecomputePlan)
  const bool rerun_mlp = c.recompute.mlp && !w.moe.defined();
  const bool rerun_moe = c.recompute.moe && w.moe.defined();
  // --moe-zero-memory level1 drops the shared expert's state too (MindSpeed recomputes its fc1 and
  // activation): it reruns like --recompute-modules shared_experts.
  const MoeZeroMemory zero_memory = w.moe.defined() ? moe_zero_memory(rt, layer) : MoeZeroMemory::kOff;
  const bool rerun_shared = (c.recompute.shared_experts || c.recompute.moe || zero_memory == MoeZeroMemory::kLevel1) &&
                            w.shared.defined();
  if (w.moe.defined()) {  // router, experts, weighted sum [Tl, H]
    MoeAuxLosses aux;
    // --recompute-modules moe: this forward's state only gives the aux losses and counts; dropped at the end
    MoeSaved moe_dropped;
    MoeSaved* moe_saved = saved ? (rerun_moe ? &moe_dropped : &saved->moe) : nullptr;
    Tensor shared;  // the shared expert's output; --moe-shared-expert-overlap: during the dispatch
    const auto run_shared = [&] {
      shared = shared_expert_forward(c, ops, pb, w.shared, part, norm2_out,
                                     saved && !rerun_shared ? &saved->shared : nullptr);
    };
    const std::function<void()> overlap =
        w.shared.defined() && overlaps_shared_expert(rt) ? std::function<void()>(run_shared) : nullptr;
    fc2 = moe_forward(c, ops, pb, w.moe, norm2_out, moe_saved, &aux, part.ep, part.ep_allgather, part.etp,
                      part.moe_seq, B, overlap, moe_router_key(rt, layer), zero_memory, part.ep_hot_groups);
    if (saved && rerun_moe)  // global_aux_loss: the rerun needs the n̄ this forward used
      for (const MoeRouterSaved::AuxTerm& term : moe_dropped.router.aux)
        if (term.kind == kMoeGlobalAux) saved->moe_global_aux_counts = term.counts;
    if (saved && rt.moe_losses) {
      for (int kind = 0; kind < kMoeAuxKinds; ++kind) rt.moe_losses->balancing(kind) += aux.balancing(kind);
      rt.moe_losses->z += aux.z;
    }
    if (saved && rt.moe_token_counts && w.moe.expert_bias >= 0) {  // the expert-bias update's counts
      std::vector<int64_t>& n = (*rt.moe_token_counts)[layer];
      n.resize(moe_saved->tokens_per_expert.size(), 0);
      for (size_t e = 0; e < n.size(); ++e) n[e] += moe_saved->tokens_per_expert[e];
    }
    if (w.shared.defined()) {  // routed + shared
      if (!shared.defined()) run_shared();
      add_inplace(fc2.data<float>(), shared.data<float>(), Tl * H);
    }
  } else if (w.linear_mlp_w >= 0) {  // a heterogeneous layer's linear replacement (bias inside)
    fc2 = linear_replacement_forward(rt, pb, w.linear_mlp_w, w.linear_mlp_b, mlp_in, &norm2_out);  // [Tl, H]
  } else {
    fc1_out = column_linear_forward(rt, pb, w.fc1_w, w.lora_fc1, mlp_in, &norm2_out, &u_fc1);  // [T, Fl or 2Fl]
    act = activation_forward(rt, fc1_out.data<float>(), w.fc1_b >= 0 ? pb.param_data(w.fc1_b) : nullptr, T, Fl);
    fc2 = row_linear_forward(rt, pb, w.fc2_w, w.lora_fc2, act, &u_fc2);  // [Tl, H]
  }
  if (w.post_mlp_norm_w >= 0) {  // --post-norm: the MLP output normalised before its bias and the residual
    Tensor stats;
    Tensor normed = norm_forward(rt, pb, w.post_mlp_norm_w, w.post_mlp_norm_b, fc2, &stats);
    if (saved) {
      saved->post_mlp_in = fc2;
      saved->post_mlp_stats = stats;
    }
    fc2 = normed;
  }
  Tensor x_out = Tensor::empty({Tl, H});
  if (rt.mhc_half != 0) {  // mHC's MLP half: the output with its bias (model/mhc_layer.h)
    if (w.fc2_b >= 0) add_bias_ref(fc2.data<float>(), pb.param_data(w.fc2_b), Tl, H);
    x_out = fc2;
  } else {
    ops.bias_dropout_add(fc2.data<float>(), w.fc2_b >= 0 ? pb.param_data(w.fc2_b) : nullptr, x_mid.data<float>(),
                         x_out.data<float>(), Tl, H, hidden_dropout(rt, layer, 2));
  }

  if (saved) {
    saved->x_in = x_in;
    saved->norm1_stats = norm1_stats;
    const bool keep_norm = !recomputes(rt, layer, c.recompute.norm_layers);
    const bool keep_act = !recomputes(rt, layer, c.recompute.activation_layers);
    saved->norm1_out = keep_norm ? norm1_out : Tensor();
    saved->ctx = ctx;
    saved->x_mid = x_mid;
    saved->norm2_stats = norm2_stats;
    saved->norm2_out = keep_norm && !rerun_mlp && !rerun_moe ? norm2_out : Tensor();
    // The MLP's input: a dense layer's rerun takes it (or recomputes it with the norm), a MoE
    // layer's moe or shared-expert rerun takes it (the tensor moe.x holds anyway).
    saved->mlp_in = (rerun_mlp && keep_norm) || rerun_moe || rerun_shared ? mlp_in : Tensor();
    saved->fc1_out = rerun_mlp ? Tensor() : fc1_out;
    saved->act = keep_act && !rerun_mlp ? act : Tensor();
    saved->lora_qkv_u = u_qkv;
    saved->lora_proj_u = u_proj;
    saved->lora_fc1_u = rerun_mlp ? Tensor() : u_fc1;
    saved->lora_fc2_u = rerun_mlp ? Tensor() : u_fc2;
  }
  return x_out;
}

Tensor transformer_layer_backward(const LayerRuntime& rt, ParamBuffer& pb, const LayerParamIds& w, int64_t layer,
                                  LayerSaved& s, const Tensor& d_out) {
  const ModelConfig& c = *rt.config;
  if (c.is_noop_layer(layer)) return d_out;
  if (c.mhc.enabled && rt.mhc_half == 0) return mhc_layer_backward(rt, pb, w, layer, s, d_out);
  if (w.mamba.defined()) return mamba_layer_backward(rt, pb, w.mamba, layer, s.mamba, d_out);
  if (rt.part->tp2d()) return tp2d_layer_backward(rt, pb, w, layer, s, d_out);
  if (!has_attention(c, layer) && !has_mlp(c, layer)) return d_out;
  if (c.layer_differs(layer)) {
    const ModelConfig lc = c.for_layer(layer);
    LayerRuntime lrt = rt;
    lrt.config = &lc;
    lrt.attention = layer_attention_problem(rt, lc);
    return transformer_layer_backward(lrt, pb, w, layer, s, d_out);
  }
  const ModelPartition& part = *rt.part;
  const OpTable& ops = *rt.ops;
  const LayerShares shares = layer_shares(c, part);
  const int64_t NHl = shares.heads, KVl = shares.groups, HD = c.head_dim, Fl = shares.ffn;
  const int64_t B = rt.mb->B, S = rt.mb->S, T = S * B, Tl = d_out.size(0), H = c.hidden;
  const NormSpec norm{c.rms_norm, c.norm_eps};
  auto grad_or_null = [&](int id) { return id >= 0 ? pb.grad_data(id) : nullptr; };

  Tensor d_x_mid;
  if (!has_mlp(c, layer) || rt.mhc_half == 1) {  // a hybrid model's attention layer ('*'), mHC's attention half
    d_x_mid = d_out;
  } else {
    // ---- MLP block ----  d_x_mid starts as d_out (residual), later += norm2 backward.
    Tensor d_fc2 = Tensor::empty({Tl, H});
    ops.bias_dropout_add_backward(d_out.data<float>(), d_fc2.data<float>(), grad_or_null(w.fc2_b), Tl, H,
                                  hidden_dropout(rt, layer, 2));
    if (w.post_mlp_norm_w >= 0) d_fc2 = post_norm_backward(rt, pb, w.post_mlp_norm_w, w.post_mlp_norm_b, d_fc2,
                                                           s.post_mlp_in, s.post_mlp_stats);
    Tensor d_norm2;
    if (w.moe.defined()) {  // the MoE MLP kept its own input (norm2's output)
      if (!s.moe.x.defined()) {  // --recompute-modules moe: rerun it (no aux losses or counts: forward's)
        FlopCountRecompute recompute;  // --op-cal-tflops: counted with recompute only
        GALE_CHECK(s.mlp_in.defined()) << "layer " << layer << ": MoE backward without the MoE's input";
        MoeRouterKey key = moe_router_key(rt, layer);
        if (!s.moe_global_aux_counts.empty()) key.global_aux_counts = &s.moe_global_aux_counts;
        moe_forward(c, ops, pb, w.moe, s.mlp_in, &s.moe, nullptr, part.ep, part.ep_allgather, part.etp, part.moe_seq,
                    B, nullptr, key, moe_zero_memory(rt, layer), part.ep_hot_groups);
      }
      Tensor d_shared;  // --moe-shared-expert-overlap / --moe-alltoall-overlap-comm: during the gradients' dispatch
      const auto run_shared = [&] {
        if (!s.shared.x.defined()) {  // --recompute-modules shared_experts (or moe), --moe-zero-memory level1
          FlopCountRecompute recompute;
          GALE_CHECK(s.mlp_in.defined()) << "layer " << layer << ": shared-expert rerun without the MoE's input";
          shared_expert_forward(c, ops, pb, w.shared, part, s.mlp_in, &s.shared);
        }
        d_shared = shared_expert_backward(c, ops, pb, w.shared, part, s.shared, d_fc2, rt.weight_grads);
      };
      d_norm2 = moe_backward(c, ops, pb, w.moe, s.moe, d_fc2, rt.moe_router_aux_scale, part.ep, part.etp,
                             w.shared.defined() && overlaps_shared_expert(rt) ? std::function<void()>(run_shared)
                                                                              : nullptr,
                             rt.weight_grads);
      if (w.shared.defined()) {
        if (!d_shared.defined()) run_shared();
        add_inplace(d_norm2.data<float>(), d_shared.data<float>(), Tl * H);
      }
      s.mlp_in = Tensor();
      d_fc2 = Tensor();
      s.norm2_out = Tensor();
    } else if (w.linear_mlp_w >= 0) {  // a heterogeneous layer's linear replacement
      if (!s.norm2_out.defined()) {  // recomputed
        Tensor stats;
        s.norm2_out = norm_output_for_linear(rt, norm_forward(rt, pb, w.norm2_w, w.norm2_b, s.x_mid, &stats));
      }
      d_norm2 = linear_replacement_backward(rt, pb, w.linear_mlp_w, w.linear_mlp_b, d_fc2, s.norm2_out);
      d_fc2 = Tensor();
      s.norm2_out = Tensor();
    } else {
      if (!s.fc1_out.defined()) {  // --recompute-modules mlp: rerun the MLP's forward up to fc2's input
        FlopCountRecompute recompute;
        Tensor in = s.mlp_in;
        if (!in.defined()) {  // with layernorm recompute: from x_mid
          Tensor stats;
          in = to_gemm_input(norm_forward(rt, pb, w.norm2_w, w.norm2_b, s.x_mid, &stats), c.gemm_dtype());
        }
        s.mlp_in = Tensor();
        s.fc1_out = column_linear_forward(rt, pb, w.fc1_w, w.lora_fc1, in, &s.norm2_out, &s.lora_fc1_u);
        in = Tensor();
        s.act = activation_forward(rt, s.fc1_out.data<float>(), w.fc1_b >= 0 ? pb.param_data(w.fc1_b) : nullptr, T, Fl);
        if (w.lora_fc2.defined()) adapted_linear_forward(rt, pb, w.fc2_w, w.lora_fc2, s.act, &s.lora_fc2_u);
      }
      if (!s.act.defined()) s.act = activation_forward(rt, s.fc1_out.data<float>(), nullptr, T, Fl);  // recomputed
      Tensor d_act = row_linear_backward(rt, pb, w.fc2_w, w.lora_fc2, d_fc2, s.act, s.lora_fc2_u);  // [T, Fl]
      d_fc2 = Tensor();
      s.act = Tensor();
      Tensor d_fc1 = Tensor::empty(s.fc1_out.shape());
      mlp_activation_backward(c, ops)(d_act.data<float>(), s.fc1_out.data<float>(), d_fc1.data<float>(),
                                      grad_or_null(w.fc1_b), T, Fl);
      d_act = Tensor();
      s.fc1_out = Tensor();
      if (!s.norm2_out.defined()) {  // recomputed from x_mid (forward fused it with the residual add)
        Tensor stats;
        s.norm2_out = norm_output_for_linear(rt, norm_forward(rt, pb, w.norm2_w, w.norm2_b, s.x_mid, &stats));
      }
      d_norm2 = column_linear_backward(rt, pb, w.fc1_w, w.lora_fc1, d_fc1, s.norm2_out, s.lora_fc1_u);
      d_fc1 = Tensor();
      s.norm2_out = Tensor();
    }
    d_x_mid = Tensor::empty({Tl, H});
    ops.norm_backward(norm, d_norm2.data<float>(), s.x_mid.data<float>(), NormScale(c, pb, w.norm2_w).data(),
                      s.norm2_stats.data<float>(), d_x_mid.data<float>(), pb.grad_data(w.norm2_w),
                      grad_or_null(w.norm2_b), Tl, H);
    if (rt.mhc_half == 0) add_inplace(d_x_mid.data<float>(), d_out.data<float>(), Tl * H);  // the residual's gradient
    d_norm2 = Tensor();
    s.x_mid = s.norm2_stats = Tensor();
  }
  if (!has_attention(c, layer) || rt.mhc_half == 2) {  // a hybrid model's MLP or MoE layer ('-', 'E'), mHC's MLP half: x_mid is x_in
    s.x_in = Tensor();
    return d_x_mid;
  }

  // ---- attention block ----
  Tensor d_proj = Tensor::empty({Tl, H});
  ops.bias_dropout_add_backward(d_x_mid.data<float>(), d_proj.data<float>(), grad_or_null(w.proj_b), Tl, H,
                                hidden_dropout(rt, layer, 1));
  if (w.post_attn_norm_w >= 0) d_proj = post_norm_backward(rt, pb, w.post_attn_norm_w, w.post_attn_norm_b, d_proj,
                                                           s.post_attn_in, s.post_attn_stats);
  Tensor d_norm1;
  if (w.gdn.defined()) {  // the GDN mixer in attention's place: [Tl, H]
    d_norm1 = gdn_backward(gdn_dims(rt), gdn_layer_weights(rt, pb, w.gdn), s.gdn, d_proj, S, B);
    d_proj = Tensor();
  } else if (w.linear_attn_w >= 0) {  // a heterogeneous layer's linear replacement
    if (!s.norm1_out.defined()) {  // recomputed
      Tensor stats;
      s.norm1_out = norm_output_for_linear(rt, norm_forward(rt, pb, w.norm1_w, w.norm1_b, s.x_in, &stats));
    }
    d_norm1 = linear_replacement_backward(rt, pb, w.linear_attn_w, w.linear_attn_b, d_proj, s.norm1_out);
    d_proj = Tensor();
    s.norm1_out = Tensor();
  } else {
    Tensor d_ctx = row_linear_backward(rt, pb, w.proj_w, w.lora_proj, d_proj, s.ctx, s.lora_proj_u);  // [T, NHl·HD]
    d_proj = Tensor();
    AttentionProblem ap = rt.attention;
    ap.dropout_stream = dropout_stream(c.seed, layer, 0);
    ap.window = c.layer_window(layer);  // --window-attn-skip-freq: this layer's window or none
    if (w.mla.defined()) {
      d_norm1 = mla_attention_backward(rt, pb, w.mla, ap, s.mla, d_ctx);  // [Tl, H], whole
      d_ctx = Tensor();
      s.ctx = Tensor();
    } else {
      const HeadLayout ql = qkv_query_layout(NHl, KVl, HD), kl = qkv_key_layout(NHl, KVl, HD);
      Tensor d_gate;  // --attention-output-gate: through σ(gate) to attention's own output
      if (s.gate.defined()) {
        Tensor d_ungated = Tensor::empty(d_ctx.shape());
        d_gate = Tensor::empty(s.gate.shape());
        output_gate_backward(d_ctx.data<float>(), s.ctx_ungated.data<float>(), s.gate.data<float>(),
                             d_ungated.data<float>(), d_gate.data<float>(), d_ctx.numel());
        d_ctx = d_ungated;
        s.ctx = s.ctx_ungated;
        s.ctx_ungated = s.gate = Tensor();
      }
      float* d_offset = nullptr;  // --softmax-type learnable: the sink logits' gradient
      set_softmax_offset(rt, pb, w, &ap, &d_offset);
      Tensor d_qkv = core_attention_backward(rt, ap, s.attention, s.ctx, d_ctx, d_offset);  // [T, (NHl + 2·KVl)·HD]
      float* dq = d_qkv.data<float>();
      d_ctx = Tensor();
      s.ctx = Tensor();
      if (rt.rope && c.layer_rope(layer)) {
        ops.rope_backward(dq, ql, NHl, S, B, HD, rt.rope_positions.data(), *rt.rope);
        ops.rope_backward(dq, kl, KVl, S, B, HD, rt.rope_positions.data(), *rt.rope);
      }
      qk_norm_backward(rt, pb, w, d_qkv, NHl, KVl, s);
      if (d_gate.defined()) d_qkv = merge_output_gate(d_qkv, d_gate, NHl, KVl, HD);  // linear_qkv's rows
      if (w.qkv_b >= 0) column_sum_accumulate(d_qkv.data<float>(), pb.grad_data(w.qkv_b), T, d_qkv.size(1));
      if (!s.norm1_out.defined()) {  // recomputed
        Tensor stats;
        s.norm1_out = norm_output_for_linear(rt, norm_forward(rt, pb, w.norm1_w, w.norm1_b, s.x_in, &stats));
      }
      d_norm1 = column_linear_backward(rt, pb, w.qkv_w, w.lora_qkv, d_qkv, s.norm1_out, s.lora_qkv_u);
      d_qkv = Tensor();
      s.norm1_out = Tensor();
    }
  }
  Tensor d_x_in;
  if (mla_down_proj_fused(rt, w.mla)) {  // --mla-down-proj-fusion: MLA's backward went through the input norm already
    d_x_in = d_norm1;
  } else {
    d_x_in = Tensor::empty({Tl, H});
    ops.norm_backward(norm, d_norm1.data<float>(), s.x_in.data<float>(), NormScale(c, pb, w.norm1_w).data(),
                      s.norm1_stats.data<float>(), d_x_in.data<float>(), pb.grad_data(w.norm1_w),
                      grad_or_null(w.norm1_b), Tl, H);
  }
  if (rt.mhc_half == 0) add_inplace(d_x_in.data<float>(), d_x_mid.data<float>(), Tl * H);  // the residual's gradient
  s.x_in = s.norm1_stats = Tensor();
  return d_x_in;
}

}  // namespace gale
