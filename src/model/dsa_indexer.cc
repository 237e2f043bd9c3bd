// DeepSeek sparse attention's lightning indexer: parameters, top-k forward, KL loss and its backward.
#include "model/dsa_indexer.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "model/core_attention.h"
#include "model/kv_cache.h"
#include "model/linear.h"
#include "model/param_builders.h"

namespace gale {

namespace {

std::string indexer_name(int64_t layer, const char* rest) {
  return str_cat("decoder.layers.", layer, ".self_attention.indexer.", rest);
}

LinearWeight weight(const LayerRuntime& rt, const ParamBuffer& pb, int id) {
  return linear_weight(pb, id, rt.ops->gemm, rt.ops->bf16_gemm);
}

NormSpec k_norm_spec(const ModelConfig& c) { return NormSpec{false, c.norm_eps}; }  // always LayerNorm

// The indexer's queries, keys and weights of the rows of x and qr (S positions of B samples at
// rt.rope_positions) into st, with the inputs and k_norm's input and statistics.
void indexer_project(const LayerRuntime& rt, const ParamBuffer& pb, const DsaIndexerIds& ids, const Tensor& x,
                     const Tensor& qr, DsaIndexerState* st) {
  const ModelConfig& c = *rt.config;
  const DsaConfig& d = c.dsa;
  const int64_t B = rt.mb->B, S = rt.mb->S, T = S * B, R = c.mla.qk_pos_emb_head_dim;
  GALE_CHECK(x.size(0) == T && qr.size(0) == T) << "DSA indexer: whole sequences on this rank";
  st->x = x;
  st->qr = qr;
  st->q = linear_forward(qr, weight(rt, pb, ids.wq_b));  // [T, NI·DI]
  rt.ops->rope_forward(st->q.data<float>(), contiguous_heads_layout(d.n_heads, d.head_dim), d.n_heads, S, B, R,
                       rt.rope_positions.data(), *rt.rope);
  st->k_pre = linear_forward(x, weight(rt, pb, ids.wk));  // [T, DI]
  st->k = Tensor::empty({T, d.head_dim});
  st->k_stats = Tensor::empty({2, T});
  rt.ops->norm_forward(k_norm_spec(c), st->k_pre.data<float>(), pb.param_data(ids.k_norm_w), pb.param_data(ids.k_norm_b),
                       st->k.data<float>(), st->k_stats.data<float>(), T, d.head_dim);
  rt.ops->rope_forward(st->k.data<float>(), contiguous_heads_layout(1, d.head_dim), 1, S, B, R,
                       rt.rope_positions.data(), *rt.rope);
  st->w = linear_forward(x, weight(rt, pb, ids.weights_proj));  // [T, NI]
  const float w_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.n_heads * d.head_dim)));
  for (int64_t e = 0; e < st->w.numel(); ++e) st->w.data<float>()[e] *= w_scale;
}

}  // namespace

DsaIndexerIds register_dsa_indexer_params(ParamBuffer& pb, const ModelConfig& c, int64_t layer) {
  const DsaConfig& d = c.dsa;
  const int64_t H = c.hidden, q_in = c.mla.q_lora_rank > 0 ? c.mla.q_lora_rank : H;
  const float std = c.init_std;
  DsaIndexerIds ids;
  ids.wq_b = pb.add(make_param_spec(indexer_name(layer, "linear_wq_b.weight"), {d.n_heads * d.head_dim, q_in},
                                    InitKind::kNormal, std, true));
  ids.wk = pb.add(make_param_spec(indexer_name(layer, "linear_wk.weight"), {d.head_dim, H}, InitKind::kNormal, std, true));
  ids.k_norm_w = pb.add(make_param_spec(indexer_name(layer, "k_norm.weight"), {d.head_dim}, InitKind::kOnes, 0.0f, false));
  ids.k_norm_b = pb.add(make_param_spec(indexer_name(layer, "k_norm.bias"), {d.head_dim}, InitKind::kZeros, 0.0f, false));
  ids.weights_proj = pb.add(make_param_spec(indexer_name(layer, "linear_weights_proj.weight"), {d.n_heads, H},
                                            InitKind::kNormal, std, true));
  return ids;
}

DsaIndexerProblem dsa_indexer_problem(const ModelConfig& c, const AttentionProblem& ap, const DsaIndexerState& st) {
  DsaIndexerProblem ip;
  ip.mask = &ap;
  ip.NI = c.dsa.n_heads;
  ip.DI = c.dsa.head_dim;
  ip.topk = c.dsa.topk;
  ip.q = st.q.data<float>();
  ip.k = st.k.data<float>();
  ip.w = st.w.data<float>();
  return ip;
}

void dsa_indexer_forward(const LayerRuntime& rt, const ParamBuffer& pb, const DsaIndexerIds& ids,
                         const AttentionProblem& ap, const Tensor& x, const Tensor& qr, DsaIndexerState* st) {
  const ModelConfig& c = *rt.config;
  indexer_project(rt, pb, ids, x, qr, st);
  st->idx = Tensor::empty({x.size(0), c.dsa.topk}, DType::kI32);
  dsa_indexer_topk_ref(dsa_indexer_problem(c, ap, *st), st->idx.data<int32_t>());
}

Tensor dsa_indexer_decode(const LayerRuntime& rt, const ParamBuffer& pb, const DsaIndexerIds& ids,
                          const AttentionProblem& ap, const Tensor& x, const Tensor& qr, int64_t cached,
                          Tensor& key_cache) {
  const ModelConfig& c = *rt.config;
  const int64_t B = rt.mb->B, S = rt.mb->S, T = S * B, DI = c.dsa.head_dim;
  GALE_CHECK(ap.B == B && ap.Sq == S && ap.Sk == cached + S && key_cache.size(1) == DI &&
             key_cache.size(0) >= (cached + S) * B)
      << "DSA indexer decoding: " << S << " new positions after " << cached << " of " << B
      << " samples, an indexer key cache of " << key_cache.size(0) << " rows";
  DsaIndexerState st;
  indexer_project(rt, pb, ids, x, qr, &st);
  std::copy_n(st.k.data<float>(), T * DI, key_cache.data<float>() + cached * B * DI);  // rows s·B + b
  DsaIndexerProblem ip = dsa_indexer_problem(c, ap, st);
  ip.k = key_cache.data<float>();  // every cached position's key, the new ones last
  Tensor idx = Tensor::empty({T, c.dsa.topk}, DType::kI32);
  dsa_indexer_topk_ref(ip, idx.data<int32_t>());
  return idx;
}

Tensor dsa_indexer_ragged(const LayerRuntime& rt, const ParamBuffer& pb, const DsaIndexerIds& ids, const Tensor& x,
                          const Tensor& qr, int64_t local_layer, const std::vector<RaggedRequestKv>& requests) {
  const ModelConfig& c = *rt.config;
  const RaggedKvBatch& batch = *rt.ragged_kv;
  KvBlockPool& pool = *batch.pool;
  const int64_t DI = c.dsa.head_dim, NI = c.dsa.n_heads, K = c.dsa.topk, bt = pool.block_tokens();
  GALE_CHECK_EQ(requests.size(), batch.requests.size()) << "DSA ragged decoding: the batch's requests";
  DsaIndexerState st;
  indexer_project(rt, pb, ids, x, qr, &st);  // one sample of T rows
  Tensor idx = Tensor::empty({x.size(0), K}, DType::kI32);
  for (size_t i = 0; i < requests.size(); ++i) {
    const RaggedRequest& r = batch.requests[i];
    const RaggedRequestKv& q = requests[i];
    for (int64_t s = 0; s < q.rows; ++s) {
      const int64_t pos = r.cached + s;
      std::copy_n(st.k.data<float>() + (q.row + s) * DI, DI,
                  pool.indexer_rows(local_layer, r.blocks[static_cast<size_t>(pos / bt)]) + (pos % bt) * DI);
    }
    Tensor keys = Tensor::empty({q.L, DI});  // the request's keys of positions [0, L) in one piece
    for (int64_t b = 0; b * bt < q.L; ++b)
      std::copy_n(pool.indexer_rows(local_layer, r.blocks[static_cast<size_t>(b)]), std::min(bt, q.L - b * bt) * DI,
                  keys.data<float>() + b * bt * DI);
    DsaIndexerProblem ip = dsa_indexer_problem(c, q.p, st);
    ip.q += q.row * NI * DI;
    ip.w += q.row * NI;
    ip.k = keys.data<float>();
    dsa_indexer_topk_ref(ip, idx.data<int32_t>() + q.row * K);
  }
  return idx;
}

double dsa_indexer_loss(const LayerRuntime& rt, const DsaIndexerState& st, const AttentionProblem& ap,
                        const DsaTeacher& teacher) {
  const ModelConfig& c = *rt.config;
  const double rows = static_cast<double>(ap.B * ap.Sq);
  return c.dsa.loss_coeff / rows *
         dsa_indexer_loss_forward_ref(dsa_indexer_problem(c, ap, st), teacher, st.idx.data<int32_t>(), c.dsa.sparse_loss);
}

void dsa_indexer_backward(const LayerRuntime& rt, ParamBuffer& pb, const DsaIndexerIds& ids, const AttentionProblem& ap,
                          const DsaTeacher& teacher, double scale, DsaIndexerState& st) {
  const ModelConfig& c = *rt.config;
  const DsaConfig& d = c.dsa;
  const int64_t B = rt.mb->B, S = rt.mb->S, T = S * B, R = c.mla.qk_pos_emb_head_dim;
  const double g = scale * d.loss_coeff / static_cast<double>(T);
  Tensor dq = Tensor::empty(st.q.shape()), dk = Tensor::empty(st.k.shape()), dw = Tensor::empty(st.w.shape());
  dsa_indexer_loss_backward_ref(dsa_indexer_problem(c, ap, st), teacher, st.idx.data<int32_t>(), d.sparse_loss, g,
                                dq.data<float>(), dk.data<float>(), dw.data<float>());
  // weights: w = proj(x)·scale
  const float w_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.n_heads * d.head_dim)));
  for (int64_t e = 0; e < dw.numel(); ++e) dw.data<float>()[e] *= w_scale;
  linear_backward_weight(dw, st.x, weight(rt, pb, ids.weights_proj));
  // keys: RoPE, LayerNorm, linear_wk
  rt.ops->rope_backward(dk.data<float>(), contiguous_heads_layout(1, d.head_dim), 1, S, B, R, rt.rope_positions.data(),
                        *rt.rope);
  Tensor dk_pre = Tensor::empty(st.k_pre.shape());
  rt.ops->norm_backward(k_norm_spec(c), dk.data<float>(), st.k_pre.data<float>(), pb.param_data(ids.k_norm_w),
                        st.k_stats.data<float>(), dk_pre.data<float>(), pb.grad_data(ids.k_norm_w),
                        pb.grad_data(ids.k_norm_b), T, d.head_dim);
  linear_backward_weight(dk_pre, st.x, weight(rt, pb, ids.wk));
  // queries: RoPE, linear_wq_b
  rt.ops->rope_backward(dq.data<float>(), contiguous_heads_layout(d.n_heads, d.head_dim), d.n_heads, S, B, R,
                        rt.rope_positions.data(), *rt.rope);
  linear_backward_weight(dq, st.qr, weight(rt, pb, ids.wq_b));
  st = DsaIndexerState();
}

}  // namespace gale
