// Multi-latent attention: parameters, the latent projections, MLA RoPE, padded attention, backward.
#include "model/mla_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "core/threads.h"
#include "model/context_parallel.h"
#include "model/kv_cache.h"
#include "model/linear.h"
#include "model/norm_weight.h"
#include "model/param_builders.h"
#include "parallel/mappings.h"

namespace gale {

namespace {

std::string attn_name(int64_t layer, const char* rest) {
  return str_cat("decoder.layers.", layer, ".self_attention.", rest);
}

// A replicated parameter that sees only this rank's tokens under SP (gradient summed over TP then).
ParamSpec replicated(ParamSpec s, const ModelPartition& part) {
  s.sequence_parallel = part.sequence_parallel;
  return s;
}

// fn(t) for every token row t < rows, rows split over the compute threads (rows are independent).
template <class Fn>
void for_rows(int64_t rows, Fn&& fn) {
  parallel_for(rows, 64, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) fn(t);
  });
}

// Columns [c0, c0 + n) of src [rows, src_cols] into columns [d0, d0 + n) of dst [rows, dst_cols].
void copy_columns(const float* src, int64_t src_cols, int64_t c0, float* dst, int64_t dst_cols, int64_t d0,
                  int64_t rows, int64_t n) {
  for_rows(rows, [&](int64_t t) { std::memcpy(dst + t * dst_cols + d0, src + t * src_cols + c0, n * sizeof(float)); });
}

// Columns [c0, c0 + n) of x [rows, cols] as a new [rows, n] tensor.
Tensor columns(const Tensor& x, int64_t c0, int64_t n) {
  Tensor y = Tensor::empty({x.size(0), n});
  copy_columns(x.data<float>(), x.size(1), c0, y.data<float>(), n, 0, x.size(0), n);
  return y;
}

// MLA's RoPE input layout: R dims p -> [p0, p2, ..., p_{R-2}, p1, p3, ..., p_{R-1}] (src to dst, R floats).
void deinterleave(const float* p, float* d, int64_t R) {
  for (int64_t i = 0; i < R / 2; ++i) {
    d[i] = p[2 * i];
    d[R / 2 + i] = p[2 * i + 1];
  }
}
// Its transpose (the gradient's way back): dd -> dp.
void reinterleave(const float* dd, float* dp, int64_t R) {
  for (int64_t i = 0; i < R / 2; ++i) {
    dp[2 * i] = dd[i];
    dp[2 * i + 1] = dd[R / 2 + i];
  }
}

// Sizes of one layer on this rank.
struct Dims {
  int64_t NHl, Dn, R, Dq, Dv, D, Cq, Ckv, T, Tl, S, B, H;
};

Dims dims_of(const LayerRuntime& rt, int64_t Tl) {
  const ModelConfig& c = *rt.config;
  const MlaConfig& m = c.mla;
  Dims d;
  d.NHl = c.heads / rt.part->tp_size();
  d.Dn = m.qk_head_dim;
  d.R = m.qk_pos_emb_head_dim;
  d.Dq = m.q_head_dim();
  d.Dv = m.v_head_dim;
  d.D = m.attention_head_dim();
  d.Cq = m.q_lora_rank;
  d.Ckv = m.kv_lora_rank;
  d.B = rt.mb->B;
  d.S = rt.mb->S;
  d.T = d.S * d.B;
  d.Tl = Tl;
  d.H = c.hidden;
  return d;
}

// The packed rows the attention kernels read: head h's query, key and value at columns
// [3h·D, (3h+1)·D), [(3h+1)·D, (3h+2)·D), [(3h+2)·D, (3h+3)·D) — Megatron's packed QKV with KV = NH.
HeadLayout packed_query_layout(const Dims& d) { return qkv_query_layout(d.NHl, d.NHl, d.D); }

// Norm of a [rows, n] latent (the q or kv norm); returns the normalised copy and fills stats.
Tensor latent_norm_forward(const LayerRuntime& rt, const ParamBuffer& pb, int w, int b, const Tensor& x, Tensor* stats) {
  const ModelConfig& c = *rt.config;
  const int64_t rows = x.size(0), n = x.size(1);
  Tensor y = Tensor::empty(x.shape());
  *stats = Tensor::empty({c.rms_norm ? 1 : 2, rows});
  rt.ops->norm_forward(NormSpec{c.rms_norm, c.norm_eps}, x.data<float>(), NormScale(c, pb, w).data(),
                       b >= 0 ? pb.param_data(b) : nullptr, y.data<float>(), stats->data<float>(), rows, n);
  return y;
}

Tensor latent_norm_backward(const LayerRuntime& rt, ParamBuffer& pb, int w, int b, const Tensor& dy, const Tensor& x,
                            const Tensor& stats) {
  const ModelConfig& c = *rt.config;
  Tensor dx = Tensor::empty(x.shape());
  rt.ops->norm_backward(NormSpec{c.rms_norm, c.norm_eps}, dy.data<float>(), x.data<float>(), NormScale(c, pb, w).data(),
                        stats.data<float>(), dx.data<float>(), pb.grad_data(w), b >= 0 ? pb.grad_data(b) : nullptr,
                        x.size(0), x.size(1));
  return dx;
}

// Input of a column-parallel linear [Tl, n] -> [T, n] (SP all-gather; identity otherwise), and the
// backward of that: the partial input gradients of this rank's heads reduced (reduce-scatter / all-reduce).
Tensor gather_input(const ModelPartition& part, const Tensor& x) {
  return part.sequence_parallel ? gather_from_sequence_parallel_region(x, *part.tp) : copy_to_tp_region(x, *part.tp);
}
Tensor reduce_input_grad(const ModelPartition& part, const Tensor& dx) {
  return part.sequence_parallel ? gather_from_sequence_parallel_region_backward(dx, *part.tp)
                                : copy_to_tp_region_backward(dx, *part.tp);
}

LinearWeight weight(const LayerRuntime& rt, const ParamBuffer& pb, int id) {
  LinearWeight w = linear_weight(pb, id, rt.ops->gemm, rt.ops->bf16_gemm);
  w.defer = rt.weight_grads;  // --dualpipev-dw-detach: the weight gradient queued (null: at once)
  return w;
}

// The packed, zero-padded q/k/v rows [T, NHl·3D] attention reads (queries' rotary part rotated):
// the q projection of q_input (x_full with Cq = 0, else q_in), the kv up projection of kv_in and the
// rotated shared k_pe [T, R].
Tensor packed_qkv(const LayerRuntime& rt, const ParamBuffer& pb, const MlaParamIds& w, const Dims& d,
                  const Tensor& q_input, const Tensor& kv_in, const Tensor& k_pe) {
  Tensor q = linear_forward(q_input, weight(rt, pb, d.Cq == 0 ? w.q_proj : w.q_up));  // [T, NHl·Dq]
  Tensor kv = linear_forward(kv_in, weight(rt, pb, w.kv_up));                      // [T, NHl·(Dn + Dv)]
  Tensor qkv = Tensor::zeros({d.T, d.NHl * 3 * d.D});
  {
    float* p = qkv.data<float>();
    const float *qp = q.data<float>(), *kvp = kv.data<float>(), *kpe = k_pe.data<float>();
    const int64_t row = d.NHl * 3 * d.D;
    for_rows(d.T, [&](int64_t t) {
      for (int64_t h = 0; h < d.NHl; ++h) {
        float* qh = p + t * row + h * 3 * d.D;
        float *kh = qh + d.D, *vh = qh + 2 * d.D;
        const float* qsrc = qp + (t * d.NHl + h) * d.Dq;
        const float* kvsrc = kvp + (t * d.NHl + h) * (d.Dn + d.Dv);
        std::memcpy(qh, qsrc, d.Dn * sizeof(float));
        deinterleave(qsrc + d.Dn, qh + d.Dn, d.R);
        std::memcpy(kh, kvsrc, d.Dn * sizeof(float));
        std::memcpy(kh + d.Dn, kpe + t * d.R, d.R * sizeof(float));
        std::memcpy(vh, kvsrc + d.Dn, d.Dv * sizeof(float));
      }
    });
  }
  HeadLayout q_pe = packed_query_layout(d);
  q_pe.base += d.Dn;
  rt.ops->rope_forward(qkv.data<float>(), q_pe, d.NHl, d.S, d.B, d.R, rt.rope_positions.data(), *rt.rope);
  return qkv;
}

// Attention's padded output [T, NHl·D] -> the context [T, NHl·Dv] (each head's first Dv columns).
Tensor padded_to_ctx(const Dims& d, const Tensor& out) {
  Tensor ctx = Tensor::empty({d.T, d.NHl * d.Dv});
  for_rows(d.T, [&](int64_t t) {
    for (int64_t h = 0; h < d.NHl; ++h)
      std::memcpy(ctx.data<float>() + (t * d.NHl + h) * d.Dv, out.data<float>() + (t * d.NHl + h) * d.D,
                  d.Dv * sizeof(float));
  });
  return ctx;
}

}  // namespace

std::vector<int> MlaParamIds::all() const {
  std::vector<int> ids;
  for (int id : {q_proj, q_down, q_norm_w, q_norm_b, q_up, kv_down, kv_norm_w, kv_norm_b, kv_up, softmax_offset})
    if (id >= 0) ids.push_back(id);
  std::sort(ids.begin(), ids.end());  // --mla-down-proj-fusion registers kv_down right after q_down
  if (indexer.defined())
    for (int id : indexer.all()) ids.push_back(id);
  return ids;
}

MlaParamIds register_mla_params(ParamBuffer& pb, const ModelConfig& c, const ModelPartition& part, int64_t layer) {
  const MlaConfig& m = c.mla;
  const int64_t H = c.hidden, NH = c.heads;
  const float std = c.init_std;
  const bool ln = !c.rms_norm;
  auto norm = [&](const char* name, int64_t n, InitKind init) {
    return pb.add(replicated(make_param_spec(attn_name(layer, name), {n}, init, 0.0f, false), part));
  };
  auto add_kv_down = [&] {
    return pb.add(replicated(make_param_spec(attn_name(layer, "linear_kv_down_proj.weight"),
                                             {m.kv_lora_rank + m.qk_pos_emb_head_dim, H}, InitKind::kNormal, std, true),
                             part));
  };
  GALE_CHECK(!m.down_proj_fusion || m.q_lora_rank > 0) << "--mla-down-proj-fusion requires --q-lora-rank";
  MlaParamIds w;
  if (m.q_lora_rank == 0) {
    if (m.qk_layernorm) {  // Megatron fuses a norm of x into linear_q_proj
      w.q_norm_w = norm("linear_q_proj.layer_norm_weight", H, norm_weight_init(c));
      if (ln) w.q_norm_b = norm("linear_q_proj.layer_norm_bias", H, InitKind::kZeros);
    }
    w.q_proj = pb.add(tp_split(make_param_spec(attn_name(layer, "linear_q_proj.weight"), {NH * m.q_head_dim(), H},
                                               InitKind::kNormal, std, true), part, 0));
  } else {
    w.q_down = pb.add(replicated(make_param_spec(attn_name(layer, "linear_q_down_proj.weight"), {m.q_lora_rank, H},
                                                 InitKind::kNormal, std, true), part));
    if (m.down_proj_fusion) w.kv_down = add_kv_down();  // adjacent to q_down: [q_down; kv_down] in place
    if (m.qk_layernorm) {
      w.q_norm_w = norm("linear_q_up_proj.layer_norm_weight", m.q_lora_rank, norm_weight_init(c));
      if (ln) w.q_norm_b = norm("linear_q_up_proj.layer_norm_bias", m.q_lora_rank, InitKind::kZeros);
    }
    w.q_up = pb.add(tp_split(make_param_spec(attn_name(layer, "linear_q_up_proj.weight"), {NH * m.q_head_dim(), m.q_lora_rank},
                                             InitKind::kNormal, std, true), part, 0));
  }
  if (w.kv_down < 0) w.kv_down = add_kv_down();
  if (m.qk_layernorm) {
    w.kv_norm_w = norm("linear_kv_up_proj.layer_norm_weight", m.kv_lora_rank, norm_weight_init(c));
    if (ln) w.kv_norm_b = norm("linear_kv_up_proj.layer_norm_bias", m.kv_lora_rank, InitKind::kZeros);
  }
  w.kv_up = pb.add(tp_split(make_param_spec(attn_name(layer, "linear_kv_up_proj.weight"),
                                            {NH * (m.qk_head_dim + m.v_head_dim), m.kv_lora_rank}, InitKind::kNormal, std,
                                            true),
                            part, 0));
  // --softmax-type learnable (Megatron's core_attention of the MLA spec): one sink logit per head,
  // normal init, no weight decay, split over TP with the heads.
  if (c.softmax_type == SoftmaxType::kLearnable)
    w.softmax_offset = pb.add(tp_split(make_param_spec(attn_name(layer, "core_attention.softmax_offset"), {NH},
                                                       InitKind::kNormal, std, false),
                                       part, 0));
  if (c.dsa.enabled) w.indexer = register_dsa_indexer_params(pb, c, layer);
  return w;
}

namespace {

// --softmax-type learnable: `ap` with its sink logits pointing at the heads attention runs on (this
// TP rank's softmax_offset from the head split's first head), and their gradient in *grad when asked.
AttentionProblem with_softmax_offset(const LayerRuntime& rt, const ParamBuffer& pb, const MlaParamIds& w,
                                     const AttentionProblem& ap, float** grad) {
  AttentionProblem p = ap;
  if (w.softmax_offset < 0) return p;
  const int64_t first = ap.head_offset - rt.part->tp_rank() * (rt.config->heads / rt.part->tp_size());
  p.softmax_offset = pb.param_data(w.softmax_offset) + first;
  if (grad) *grad = pb.grad_data(w.softmax_offset) + first;
  return p;
}

}  // namespace

Tensor mla_attention_forward(const LayerRuntime& rt, const ParamBuffer& pb, const MlaParamIds& w,
                             const AttentionProblem& ap, int64_t layer, const Tensor& x_arg, Tensor* cache,
                             MlaSaved* saved) {
  const ModelConfig& c = *rt.config;
  const ModelPartition& part = *rt.part;
  const OpTable& ops = *rt.ops;
  const Dims d = dims_of(rt, x_arg.size(0));
  GALE_CHECK(rt.rope != nullptr && rt.rope->rot_dim == d.R) << "MLA needs rotary tables of --qk-pos-emb-head-dim";
  const DType gemm_dtype = c.gemm_dtype();

  // ---- --mla-down-proj-fusion: the input norm and both down projections in one pass ----
  Tensor x = x_arg, cq_fused, ckv_fused;
  MlaDownProjSaved down;
  if (mla_down_proj_fused(rt, w)) {
    const Tensor y = mla_down_proj_forward(rt, pb, w.down_proj_ids(), x_arg, &down);  // [Tl, Cq + Ckv + R]
    x = down.xn;  // the normed input (DSA's indexer reads it)
    cq_fused = columns(y, 0, d.Cq);
    ckv_fused = columns(y, d.Cq, d.Ckv + d.R);
  }

  // ---- the q projection's input: x_full [T, H] (Cq = 0) or q_in [T, Cq] ----
  Tensor x_full, q_latent, q_stats, q_in;
  if (d.Cq == 0) {
    if (w.q_norm_w >= 0) {  // the norm fused into linear_q_proj, on this rank's tokens
      q_latent = to_f32(x);
      x_full = gather_input(part, to_gemm_input(latent_norm_forward(rt, pb, w.q_norm_w, w.q_norm_b, q_latent, &q_stats), gemm_dtype));
    } else {
      x_full = gather_input(part, x);
    }
  } else {
    Tensor cq = mla_down_proj_fused(rt, w) ? cq_fused : linear_forward(x, weight(rt, pb, w.q_down));  // [Tl, Cq]
    Tensor cq_n = cq;
    if (w.q_norm_w >= 0) {
      q_latent = cq;
      cq_n = latent_norm_forward(rt, pb, w.q_norm_w, w.q_norm_b, cq, &q_stats);
    }
    q_in = gather_input(part, to_gemm_input(cq_n, gemm_dtype));  // [T, Cq]
  }

  // ---- the kv latent and the shared k_pos_emb [T, Ckv + R] ----
  Tensor ckv = mla_down_proj_fused(rt, w) ? ckv_fused : linear_forward(x, weight(rt, pb, w.kv_down));  // [Tl, Ckv + R]
  Tensor kv_latent, kv_stats;
  if (w.kv_norm_w >= 0) {
    kv_latent = columns(ckv, 0, d.Ckv);
    Tensor normed = latent_norm_forward(rt, pb, w.kv_norm_w, w.kv_norm_b, kv_latent, &kv_stats);
    copy_columns(normed.data<float>(), d.Ckv, 0, ckv.data<float>(), d.Ckv + d.R, 0, d.Tl, d.Ckv);
  }
  const Tensor ckv_all = gather_input(part, ckv);  // [T, Ckv + R]
  Tensor kv_in = to_gemm_input(columns(ckv_all, 0, d.Ckv), gemm_dtype);

  // ---- k_pe: de-interleaved and rotated once per token ----
  Tensor k_pe = Tensor::empty({d.T, d.R});
  for_rows(d.T, [&](int64_t t) {
    deinterleave(ckv_all.data<float>() + t * (d.Ckv + d.R) + d.Ckv, k_pe.data<float>() + t * d.R, d.R);
  });
  ops.rope_forward(k_pe.data<float>(), contiguous_heads_layout(1, d.R), 1, d.S, d.B, d.R, rt.rope_positions.data(),
                   *rt.rope);

  // ---- the up projections, packed and zero-padded q/k/v rows [T, NHl·3D] ----
  Tensor qkv = packed_qkv(rt, pb, w, d, d.Cq == 0 ? x_full : q_in, kv_in, k_pe);

  Tensor out, dsa_lse;
  if (w.indexer.defined()) {  // DeepSeek sparse attention over the indexer's top-k keys
    out = Tensor::empty({d.T, d.NHl * d.D});
    dsa_lse = Tensor::empty({d.B, d.NHl, d.S});
    const float* p = qkv.data<float>();
    const HeadLayout ql = packed_query_layout(d);
    if (cache) {  // decoding: the new keys, values and indexer keys join the cache; attention reads it
      append_to_kv_cache(rt, qkv, *cache);
      Tensor& keys = rt.kv_cache->indexer_keys.at(static_cast<size_t>(layer - part.first_layer));
      const Tensor idx =
          dsa_indexer_decode(rt, pb, w.indexer, ap, x, d.Cq == 0 ? x_full : q_in, rt.kv_cache->length, keys);
      const float* kv = cache->data<float>();
      ops.dsa_sparse_attention_forward(ap, idx.data<int32_t>(), c.dsa.topk, p, ql, kv, context_key_layout(d.NHl, d.D),
                                       kv, context_value_layout(d.NHl, d.D), out.data<float>(), dsa_lse.data<float>());
    } else if (rt.ragged_kv) {  // ragged decoding: each request selects and attends among its own positions
      const int64_t local = layer - part.first_layer, K = c.dsa.topk;
      const std::vector<RaggedRequestKv> requests = ragged_store_kv(rt, ap, qkv, local);
      const Tensor idx = dsa_indexer_ragged(rt, pb, w.indexer, x, d.Cq == 0 ? x_full : q_in, local, requests);
      for (const RaggedRequestKv& r : requests) {
        std::vector<float> lse(static_cast<size_t>(d.NHl * r.rows));
        ops.dsa_sparse_attention_forward(r.p, idx.data<int32_t>() + r.row * K, K, p + r.row * ql.row_stride, ql, r.kv,
                                         context_key_layout(d.NHl, d.D), r.kv, context_value_layout(d.NHl, d.D),
                                         out.data<float>() + r.row * d.NHl * d.D, lse.data());
      }
    } else {
      DsaIndexerState ist;
      dsa_indexer_forward(rt, pb, w.indexer, ap, x, d.Cq == 0 ? x_full : q_in, &ist);
      const HeadLayout kl = qkv_key_layout(d.NHl, d.NHl, d.D), vl = qkv_value_layout(d.NHl, d.NHl, d.D);
      ops.dsa_sparse_attention_forward(ap, ist.idx.data<int32_t>(), c.dsa.topk, p, ql, p, kl, p, vl, out.data<float>(),
                                       dsa_lse.data<float>());
      if (saved && rt.dsa_indexer_loss && c.dsa.loss_coeff > 0.0)
        *rt.dsa_indexer_loss += dsa_indexer_loss(rt, ist, ap, DsaTeacher{&ap, p, ql, p, kl});
      if (saved) {
        saved->attention.qkv = qkv;
        saved->indexer = std::move(ist);
        saved->dsa_lse = dsa_lse;
      }
    }
  } else {
    const AttentionProblem sp = with_softmax_offset(rt, pb, w, ap, nullptr);
    out = rt.ragged_kv ? ragged_attention_forward(rt, sp, qkv, layer - part.first_layer)
          : cache      ? cached_attention_forward(rt, sp, qkv, *cache)
                       : core_attention_forward(rt, sp, layer, qkv, saved ? &saved->attention : nullptr);  // [T, NHl·D]
  }
  Tensor ctx = padded_to_ctx(d, out);
  if (saved) {
    saved->x = x;
    saved->down = std::move(down);
    saved->x_full = x_full;
    saved->q_latent = q_latent;
    saved->q_stats = q_stats;
    saved->q_in = q_in;
    saved->kv_latent = kv_latent;
    saved->kv_stats = kv_stats;
    saved->kv_in = kv_in;
    saved->out = out;
    if (c.recompute.mla_up_proj && !cache) {  // rebuilt in backward from the inputs kept above
      saved->attention.qkv = Tensor();
      saved->k_pe = k_pe;
    }
  }
  return ctx;
}

Tensor mla_attention_backward(const LayerRuntime& rt, ParamBuffer& pb, const MlaParamIds& w, const AttentionProblem& ap,
                              MlaSaved& s, const Tensor& d_ctx) {
  GALE_CHECK(s.x.defined() && s.out.defined()) << "MLA backward without its forward's saved state";
  const ModelPartition& part = *rt.part;
  const OpTable& ops = *rt.ops;
  const Dims d = dims_of(rt, s.x.size(0));

  // ---- attention on the padded rows ----
  Tensor d_out = Tensor::zeros({d.T, d.NHl * d.D});
  for_rows(d.T, [&](int64_t t) {
    for (int64_t h = 0; h < d.NHl; ++h)
      std::memcpy(d_out.data<float>() + (t * d.NHl + h) * d.D, d_ctx.data<float>() + (t * d.NHl + h) * d.Dv,
                  d.Dv * sizeof(float));
  });
  if (!s.attention.qkv.defined()) {  // --recompute-modules mla_up_proj: rebuild the packed rows
    GALE_CHECK(s.k_pe.defined()) << "MLA backward without its packed rows or what rebuilds them";
    s.attention.qkv =
        core_attention_kept_qkv(rt, packed_qkv(rt, pb, w, d, d.Cq == 0 ? s.x_full : s.q_in, s.kv_in, s.k_pe));
    s.k_pe = Tensor();
  }
  Tensor d_qkv;
  if (w.indexer.defined()) {
    const Tensor& qkv = s.attention.qkv;
    const float* p = qkv.data<float>();
    const HeadLayout ql = packed_query_layout(d), kl = qkv_key_layout(d.NHl, d.NHl, d.D),
                     vl = qkv_value_layout(d.NHl, d.NHl, d.D);
    d_qkv = Tensor::empty(qkv.shape());
    float* dp = d_qkv.data<float>();
    ops.dsa_sparse_attention_backward(ap, s.indexer.idx.data<int32_t>(), rt.config->dsa.topk, p, ql, p, kl, p, vl,
                                      s.out.data<float>(), s.dsa_lse.data<float>(), d_out.data<float>(), dp, dp, dp);
    if (rt.config->dsa.loss_coeff > 0.0)  // the indexer's own loss (its inputs are detached: nothing flows back)
      dsa_indexer_backward(rt, pb, w.indexer, ap, DsaTeacher{&ap, p, ql, p, kl}, rt.moe_aux_scale, s.indexer);
    s.indexer = DsaIndexerState();
    s.attention = CoreAttentionSaved();
    s.dsa_lse = Tensor();
  } else {
    float* d_offset = nullptr;  // --softmax-type learnable: the sink logits' gradient
    const AttentionProblem sp = with_softmax_offset(rt, pb, w, ap, &d_offset);
    d_qkv = core_attention_backward(rt, sp, s.attention, s.out, d_out, d_offset);  // [T, NHl·3D]
  }
  d_out = Tensor();
  s.out = Tensor();
  HeadLayout q_pe = packed_query_layout(d);
  q_pe.base += d.Dn;
  ops.rope_backward(d_qkv.data<float>(), q_pe, d.NHl, d.S, d.B, d.R, rt.rope_positions.data(), *rt.rope);

  // ---- unpack: dq [T, NHl·Dq], dkv [T, NHl·(Dn + Dv)], d k_pe summed over heads [T, R] ----
  Tensor dq = Tensor::empty({d.T, d.NHl * d.Dq});
  Tensor dkv = Tensor::empty({d.T, d.NHl * (d.Dn + d.Dv)});
  Tensor dk_pe = Tensor::zeros({d.T, d.R});
  {
    const float* p = d_qkv.data<float>();
    const int64_t row = d.NHl * 3 * d.D;
    for_rows(d.T, [&](int64_t t) {  // row t's dk_pe sums its own heads only
      float* dkpe = dk_pe.data<float>() + t * d.R;
      for (int64_t h = 0; h < d.NHl; ++h) {
        const float* qh = p + t * row + h * 3 * d.D;
        const float *kh = qh + d.D, *vh = qh + 2 * d.D;
        float* qdst = dq.data<float>() + (t * d.NHl + h) * d.Dq;
        float* kvdst = dkv.data<float>() + (t * d.NHl + h) * (d.Dn + d.Dv);
        std::memcpy(qdst, qh, d.Dn * sizeof(float));
        reinterleave(qh + d.Dn, qdst + d.Dn, d.R);
        std::memcpy(kvdst, kh, d.Dn * sizeof(float));
        for (int64_t i = 0; i < d.R; ++i) dkpe[i] += kh[d.Dn + i];
        std::memcpy(kvdst + d.Dn, vh, d.Dv * sizeof(float));
      }
    });
  }
  d_qkv = Tensor();
  ops.rope_backward(dk_pe.data<float>(), contiguous_heads_layout(1, d.R), 1, d.S, d.B, d.R, rt.rope_positions.data(),
                    *rt.rope);

  // ---- keys/values: up projection, then [d latent | d k_pos_emb] reduced over TP ----
  Tensor d_cat = Tensor::empty({d.T, d.Ckv + d.R});
  {
    Tensor d_kv_in = linear_backward(dkv, s.kv_in, weight(rt, pb, w.kv_up));  // [T, Ckv]
    copy_columns(d_kv_in.data<float>(), d.Ckv, 0, d_cat.data<float>(), d.Ckv + d.R, 0, d.T, d.Ckv);
    for_rows(d.T, [&](int64_t t) {
      reinterleave(dk_pe.data<float>() + t * d.R, d_cat.data<float>() + t * (d.Ckv + d.R) + d.Ckv, d.R);
    });
  }
  dkv = dk_pe = Tensor();
  s.kv_in = Tensor();
  Tensor d_ckv = reduce_input_grad(part, d_cat);  // [Tl, Ckv + R]
  d_cat = Tensor();
  if (w.kv_norm_w >= 0) {
    Tensor d_latent = latent_norm_backward(rt, pb, w.kv_norm_w, w.kv_norm_b, columns(d_ckv, 0, d.Ckv), s.kv_latent,
                                           s.kv_stats);
    copy_columns(d_latent.data<float>(), d.Ckv, 0, d_ckv.data<float>(), d.Ckv + d.R, 0, d.Tl, d.Ckv);
  }
  s.kv_latent = s.kv_stats = Tensor();
  if (mla_down_proj_fused(rt, w)) {  // --mla-down-proj-fusion: [d cq | d ckv] through the fused GEMM and the input norm
    Tensor d_cq = reduce_input_grad(part, linear_backward(dq, s.q_in, weight(rt, pb, w.q_up)));  // [Tl, Cq]
    if (w.q_norm_w >= 0) d_cq = latent_norm_backward(rt, pb, w.q_norm_w, w.q_norm_b, d_cq, s.q_latent, s.q_stats);
    Tensor d_y = Tensor::empty({d.Tl, d.Cq + d.Ckv + d.R});
    copy_columns(d_cq.data<float>(), d.Cq, 0, d_y.data<float>(), d.Cq + d.Ckv + d.R, 0, d.Tl, d.Cq);
    copy_columns(d_ckv.data<float>(), d.Ckv + d.R, 0, d_y.data<float>(), d.Cq + d.Ckv + d.R, d.Cq, d.Tl, d.Ckv + d.R);
    d_cq = d_ckv = Tensor();
    Tensor dx = mla_down_proj_backward(rt, pb, w.down_proj_ids(), s.down, d_y);  // [Tl, H], before the norm
    s = MlaSaved();
    return dx;
  }
  Tensor dx = linear_backward(d_ckv, s.x, weight(rt, pb, w.kv_down));  // [Tl, H]
  d_ckv = Tensor();

  // ---- queries ----
  if (d.Cq == 0) {
    Tensor d_full = reduce_input_grad(part, linear_backward(dq, s.x_full, weight(rt, pb, w.q_proj)));  // [Tl, H]
    if (w.q_norm_w >= 0) d_full = latent_norm_backward(rt, pb, w.q_norm_w, w.q_norm_b, d_full, s.q_latent, s.q_stats);
    add_inplace(dx.data<float>(), d_full.data<float>(), dx.numel());
  } else {
    Tensor d_cq = reduce_input_grad(part, linear_backward(dq, s.q_in, weight(rt, pb, w.q_up)));  // [Tl, Cq]
    if (w.q_norm_w >= 0) d_cq = latent_norm_backward(rt, pb, w.q_norm_w, w.q_norm_b, d_cq, s.q_latent, s.q_stats);
    Tensor d_down = linear_backward(d_cq, s.x, weight(rt, pb, w.q_down));
    add_inplace(dx.data<float>(), d_down.data<float>(), dx.numel());
  }
  s = MlaSaved();
  return dx;
}

}  // namespace gale
