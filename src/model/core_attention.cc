// Core attention under the context-parallel layouts: head split, then local / all-gather / ring keys.
#include "model/core_attention.h"

#include <algorithm>
#include <limits>

#include "core/check.h"
#include "kernels/cpu/flash_decode.h"
#include "model/context_parallel.h"
#include "model/layer_shares.h"
#include "model/linear.h"
#include "model/ring_attention.h"

namespace gale {

namespace {

// How a Ulysses head split moves the keys and values to the ranks of the query heads.
enum class HeadSplitKv {
  kWholeGroups,  // KVl a multiple of the degree: each rank gets whole groups (queries, keys, values)
  kRepeat,       // KVl < degree (dividing it): each group's key and value repeated to its D/KVl ranks
  kAllGather,    // --use-ulysses-allgather-kv: queries by all-to-all, keys and values all-gathered
};

// The Ulysses all-to-all of a layout: the group, its split and degree (group null: no head split).
struct HeadSplit {
  Communicator* group = nullptr;
  const ContextSplit* split = nullptr;
  int64_t degree = 1;
  HeadSplitKv kv = HeadSplitKv::kWholeGroups;
};

HeadSplit head_split_of(const LayerRuntime& rt, CpAttention layout) {
  const ModelPartition& part = *rt.part;
  if (layout == CpAttention::kUlysses) return {part.cp.get(), &rt.cp_split, rt.cp_split.cp_size};
  if (layout == CpAttention::kHybrid)
    return {part.cp_hybrid.ulysses.get(), &rt.hybrid_ulysses_split, part.cp_hybrid.ulysses_degree()};
  return {};
}

// The ring (or all-gather) group and split the keys and values come from.
struct KeySource {
  Communicator* group = nullptr;
  const ContextSplit* split = nullptr;
};

KeySource key_source_of(const LayerRuntime& rt, CpAttention layout) {
  const ModelPartition& part = *rt.part;
  if (layout == CpAttention::kHybrid) return {part.cp_hybrid.ring.get(), &rt.hybrid_ring_split};
  if (layout == CpAttention::kRing || layout == CpAttention::kAllGather) return {part.cp.get(), &rt.cp_split};
  return {};
}

bool ring_keys(CpAttention layout) { return layout == CpAttention::kRing || layout == CpAttention::kHybrid; }

// Everything forward and backward decide the same way: the layout, its groups, and the heads and
// packed-QKV layouts of the rows attention runs on (NHa, KVa: this rank's heads after any head split;
// NHl, KVl: this TP rank's before it). Under kAllGather the rows are query heads only and ql
// describes them; kl and vl describe the packed rows before the split (what is gathered).
struct Plan {
  CpAttention layout;
  HeadSplit hs;
  KeySource keys;
  int64_t B, HD, NHl, KVl, NHa, KVa;
  HeadLayout ql, kl, vl;
};

Plan plan_of(const LayerRuntime& rt);

}  // namespace

CpAttention cp_attention_of(const ModelPartition& part, const ContextSplit& split) {
  if (split.cp_size <= 1) return CpAttention::kNone;
  if (part.hybrid_cp()) return CpAttention::kHybrid;
  if (part.cp_ulysses) return CpAttention::kUlysses;
  return part.cp_ring ? CpAttention::kRing : CpAttention::kAllGather;
}

namespace {

Plan plan_of(const LayerRuntime& rt) {
  const ModelConfig& c = *rt.config;
  Plan p;
  p.layout = cp_attention_of(*rt.part, rt.cp_split);
  p.hs = head_split_of(rt, p.layout);
  p.keys = key_source_of(rt, p.layout);
  p.B = rt.mb->B;
  p.HD = c.attention_head_dim();
  const LayerShares shares = layer_shares(c, *rt.part);
  p.NHl = shares.heads;
  p.KVl = shares.groups;
  const int64_t D = p.hs.degree;
  if (p.hs.group && rt.part->cp_ulysses_allgather_kv) p.hs.kv = HeadSplitKv::kAllGather;
  else if (p.hs.group && p.KVl % D != 0) p.hs.kv = HeadSplitKv::kRepeat;
  GALE_CHECK(p.NHl % D == 0 && (p.KVl % D == 0 || D % p.KVl == 0))
      << "Ulysses head split of " << p.NHl << " heads in " << p.KVl << " groups over " << D << " ranks";
  p.NHa = p.NHl / D;
  p.KVa = p.KVl % D == 0 ? p.KVl / D : 1;
  if (p.hs.kv == HeadSplitKv::kAllGather) {
    p.KVa = p.KVl;
    p.ql = contiguous_heads_layout(p.NHa, p.HD);
    p.kl = qkv_key_layout(p.NHl, p.KVl, p.HD);
    p.vl = qkv_value_layout(p.NHl, p.KVl, p.HD);
    return p;
  }
  p.ql = qkv_query_layout(p.NHa, p.KVa, p.HD);
  p.kl = qkv_key_layout(p.NHa, p.KVa, p.HD);
  p.vl = qkv_value_layout(p.NHa, p.KVa, p.HD);
  return p;
}

// The rows attention runs on for this rank's packed rows `qkv_local`: themselves, or under a head
// split the all-to-all of whole groups, of repeated groups, or of the query heads only.
Tensor split_heads(const Plan& p, const Tensor& qkv_local) {
  const HeadSplit& hs = p.hs;
  if (!hs.group) return qkv_local;
  switch (hs.kv) {
    case HeadSplitKv::kWholeGroups:
      return ulysses_seq_to_heads(*hs.group, *hs.split, p.B, qkv_local);
    case HeadSplitKv::kRepeat:
      return ulysses_seq_to_heads(*hs.group, *hs.split, p.B,
                                  repeat_kv_groups(qkv_local, p.NHl, p.KVl, p.HD, hs.degree));
    case HeadSplitKv::kAllGather:
      return ulysses_seq_to_heads(*hs.group, *hs.split, p.B, pack_query_heads(qkv_local, p.NHl, p.KVl, p.HD));
  }
  return Tensor();
}

// Backward of split_heads for the gradient of the rows attention ran on (kAllGather: of the query
// heads; the keys' and values' gradients are reduce-scattered into the result by the caller).
Tensor merge_heads_grad(const Plan& p, const Tensor& d_rows) {
  const HeadSplit& hs = p.hs;
  if (!hs.group) return d_rows;
  const Tensor d_cols = ulysses_heads_to_seq(*hs.group, *hs.split, p.B, d_rows);
  switch (hs.kv) {
    case HeadSplitKv::kWholeGroups:
      return d_cols;
    case HeadSplitKv::kRepeat:
      return sum_repeated_kv_groups(d_cols, p.NHl, p.KVl, p.HD, hs.degree);
    case HeadSplitKv::kAllGather: {
      Tensor d_qkv = Tensor::empty({d_cols.size(0), (p.NHl + 2 * p.KVl) * p.HD});
      unpack_query_heads_grad(d_cols, d_qkv.data<float>(), p.NHl, p.KVl, p.HD);
      return d_qkv;
    }
  }
  return Tensor();
}

// --qk-clip / --log-max-attention-logit: where the largest pre-softmax logits of the heads attention
// runs on go, in rt.max_attention_logits[layer] ([NHl], this TP rank's heads, -inf until seen). Under
// a Ulysses split of whole groups (ulysses_cp_algo, or hybrid's Ulysses sub-group) rank r of the
// group runs heads [r·NHa, (r + 1)·NHa) of its TP rank's; the others stay -inf here and are filled
// in by the data-parallel × context-parallel MAX reduction after the step (model/qk_clip.h).
// Repeated or all-gathered Ulysses keys are refused at start-up (train/arguments_qk_clip.cc).
float* max_logit_destination(const LayerRuntime& rt, const Plan& p, int64_t layer) {
  GALE_CHECK(p.hs.kv == HeadSplitKv::kWholeGroups)
      << "--qk-clip / --log-max-attention-logit: repeated or all-gathered Ulysses keys (refused at start-up)";
  std::vector<float>& m = (*rt.max_attention_logits)[layer];
  if (m.empty()) m.assign(static_cast<size_t>(p.NHl), -std::numeric_limits<float>::infinity());
  GALE_CHECK_EQ(static_cast<int64_t>(m.size()), p.NHl) << "max attention logits of layer " << layer;
  return m.data() + (p.hs.group ? p.hs.group->rank() * p.NHa : 0);
}

// Ring attention takes its kernel as a plain function pointer: under --qk-clip the kernel and the
// destination travel in these (set around ring_attention_forward on the calling thread), and each
// key block's problem (its positions, masks and skipped blocks) also gives its maxima.
thread_local AttentionForwardFn tl_ring_forward = nullptr;
thread_local float* tl_ring_max_logit = nullptr;

void ring_forward_recording_max_logit(const AttentionProblem& p, const float* q, const HeadLayout& ql, const float* k,
                                      const HeadLayout& kl, const float* v, const HeadLayout& vl, float* out,
                                      float* lse) {
  tl_ring_forward(p, q, ql, k, kl, v, vl, out, lse);
  attention_max_logit_ref(p, q, ql, k, kl, tl_ring_max_logit);
}

}  // namespace

Tensor core_attention_forward(const LayerRuntime& rt, const AttentionProblem& ap, int64_t layer, const Tensor& qkv_local,
                              CoreAttentionSaved* saved) {
  const OpTable& ops = *rt.ops;
  const Plan p = plan_of(rt);
  const auto& [layout, hs, keys, B, HD, NHl, KVl, NHa, KVa, ql, kl, vl] = p;
  const Tensor qkv = split_heads(p, qkv_local);
  const int64_t rows = qkv.size(0);
  Tensor out = Tensor::empty({rows, NHa * HD});
  Tensor lse = Tensor::empty({B, NHa, rows / B});
  Tensor kv_global;
  RingSaved ring;
  const float* q = qkv.data<float>();
  float* max_logit = rt.max_attention_logits ? max_logit_destination(rt, p, layer) : nullptr;
  if (ring_keys(layout)) {
    // The cache serves only a backward: without `saved` nothing is kept.
    const RingOptions opts = rt.part->ring_options(saved ? layer : -1);
    AttentionForwardFn forward = ops.attention_forward;
    if (max_logit) {
      tl_ring_forward = forward;
      tl_ring_max_logit = max_logit;
      forward = &ring_forward_recording_max_logit;
    }
    ring = ring_attention_forward(*keys.group, *keys.split, opts, forward, ap, q, ql, kl, vl, out.data<float>(),
                                  lse.data<float>());
    tl_ring_forward = nullptr;
    tl_ring_max_logit = nullptr;
  } else if (layout == CpAttention::kAllGather || hs.kv == HeadSplitKv::kAllGather) {
    kv_global = hs.kv == HeadSplitKv::kAllGather
                    ? all_gather_context_kv(*hs.group, *hs.split, B, qkv_local.data<float>(), kl, vl, KVa, HD)
                    : all_gather_context_kv(*keys.group, *keys.split, B, q, kl, vl, KVa, HD);
    const float* kv = kv_global.data<float>();
    ops.attention_forward(ap, q, ql, kv, context_key_layout(KVa, HD), kv, context_value_layout(KVa, HD),
                          out.data<float>(), lse.data<float>());
  } else {
    ops.attention_forward(ap, q, ql, q, kl, q, vl, out.data<float>(), lse.data<float>());
  }
  if (max_logit && !ring_keys(layout))  // local keys, or every key all-gathered
    attention_max_logit_ref(ap, q, ql, kv_global.defined() ? kv_global.data<float>() : q,
                            kv_global.defined() ? context_key_layout(KVa, HD) : kl, max_logit);
  Tensor ctx = hs.group ? ulysses_heads_to_seq(*hs.group, *hs.split, B, out) : out;
  if (saved) {
    saved->qkv = qkv;
    saved->lse = lse;
    saved->kv_global = kv_global;
    saved->ring = ring;
    saved->head_out = hs.group ? out : Tensor();
  }
  return ctx;
}

Tensor core_attention_kept_qkv(const LayerRuntime& rt, const Tensor& qkv) {
  const Plan p = plan_of(rt);
  GALE_CHECK(p.hs.kv != HeadSplitKv::kAllGather) << "--use-ulysses-allgather-kv keeps the gathered keys and values too";
  return split_heads(p, qkv);
}

void append_to_kv_cache(const LayerRuntime& rt, const Tensor& qkv, Tensor& cache) {
  const ModelConfig& c = *rt.config;
  const LayerShares shares = layer_shares(c, *rt.part);
  const int64_t B = rt.mb->B, S = rt.mb->S, HD = c.attention_head_dim();
  const int64_t NHl = shares.heads, KVl = shares.groups, first = rt.kv_cache->length;
  GALE_CHECK(rt.cp_split.cp_size == 1 && B == rt.kv_cache->B && first + S <= rt.kv_cache->max_length)
      << "kv cache: " << first << " + " << S << " positions of " << B << " samples in a cache of "
      << rt.kv_cache->max_length << " x " << rt.kv_cache->B;
  const Tensor kv_new =
      pack_context_kv(S * B, qkv.data<float>(), qkv_key_layout(NHl, KVl, HD), qkv_value_layout(NHl, KVl, HD), KVl, HD);
  std::copy_n(kv_new.data<float>(), kv_new.numel(), cache.data<float>() + first * B * kv_new.size(1));
}

Tensor cached_attention_forward(const LayerRuntime& rt, const AttentionProblem& ap, const Tensor& qkv, Tensor& cache) {
  const ModelConfig& c = *rt.config;
  const LayerShares shares = layer_shares(c, *rt.part);
  const int64_t B = rt.mb->B, S = rt.mb->S, HD = c.attention_head_dim();
  const int64_t NHl = shares.heads, KVl = shares.groups;
  append_to_kv_cache(rt, qkv, cache);
  const float* q = qkv.data<float>();
  const HeadLayout ql = qkv_query_layout(NHl, KVl, HD);
  Tensor out = Tensor::empty({S * B, NHl * HD});
  Tensor lse = Tensor::empty({B, NHl, S});
  const float* kv = cache.data<float>();
  if (rt.kv_cache->flash_decode_chunk > 0 && S == 1 && B == 1)
    flash_decode_forward(ap, q, ql, kv, context_key_layout(KVl, HD), kv, context_value_layout(KVl, HD),
                         rt.kv_cache->flash_decode_chunk, out.data<float>(), lse.data<float>());
  else
    rt.ops->attention_forward(ap, q, ql, kv, context_key_layout(KVl, HD), kv, context_value_layout(KVl, HD),
                              out.data<float>(), lse.data<float>());
  return out;
}

std::vector<RaggedRequestKv> ragged_store_kv(const LayerRuntime& rt, const AttentionProblem& ap, const Tensor& qkv,
                                             int64_t local_layer) {
  const ModelConfig& c = *rt.config;
  const LayerShares shares = layer_shares(c, *rt.part);
  const int64_t NHl = shares.heads, KVl = shares.groups, HD = c.attention_head_dim();
  RaggedKvBatch& batch = *rt.ragged_kv;
  KvBlockPool& pool = *batch.pool;
  const int64_t T = qkv.size(0), W = 2 * KVl * HD, bt = pool.block_tokens();
  GALE_CHECK(rt.cp_split.cp_size == 1 && rt.mb->B == 1 && pool.row_width() == W)
      << "ragged kv: one row sequence without context parallelism";
  const Tensor kv_new = pack_context_kv(T, qkv.data<float>(), qkv_key_layout(NHl, KVl, HD),
                                        qkv_value_layout(NHl, KVl, HD), KVl, HD);
  std::vector<RaggedRequestKv> out;
  out.reserve(batch.requests.size());
  int64_t row = 0;
  for (const RaggedRequest& r : batch.requests) {
    const int64_t L = r.cached + r.rows;
    GALE_CHECK(static_cast<int64_t>(r.blocks.size()) * bt >= L && row + r.rows <= T)
        << "ragged kv: " << L << " positions in " << r.blocks.size() << " blocks of " << bt;
    for (int64_t i = 0; i < r.rows; ++i) {
      const int64_t pos = r.cached + i;
      std::copy_n(kv_new.data<float>() + (row + i) * W, W,
                  pool.rows(local_layer, r.blocks[static_cast<size_t>(pos / bt)]) + (pos % bt) * W);
    }
    RaggedRequestKv q;
    q.row = row;
    q.rows = r.rows;
    q.L = L;
    if (L <= bt) {  // the request's positions in one piece (gathered when they span blocks)
      q.kv = pool.rows(local_layer, r.blocks[0]);
    } else {
      q.gathered = Tensor::empty({L, W});
      for (int64_t b = 0; b * bt < L; ++b)
        std::copy_n(pool.rows(local_layer, r.blocks[static_cast<size_t>(b)]), std::min(bt, L - b * bt) * W,
                    q.gathered.data<float>() + b * bt * W);
      q.kv = q.gathered.data<float>();
    }
    q.positions.resize(static_cast<size_t>(r.rows));
    for (int64_t i = 0; i < r.rows; ++i) q.positions[static_cast<size_t>(i)] = static_cast<int32_t>(r.cached + i);
    q.p = ap;
    q.p.B = 1;
    q.p.Sq = r.rows;
    q.p.Sk = L;
    q.p.k_positions = nullptr;
    q.p.max_positions = L;
    out.push_back(std::move(q));
    out.back().p.q_positions = out.back().positions.data();
    row += r.rows;
  }
  GALE_CHECK_EQ(row, T) << "ragged kv: the requests' rows do not cover the micro-batch";
  return out;
}

Tensor ragged_attention_forward(const LayerRuntime& rt, const AttentionProblem& ap, const Tensor& qkv,
                                int64_t local_layer) {
  const ModelConfig& c = *rt.config;
  const LayerShares shares = layer_shares(c, *rt.part);
  const int64_t NHl = shares.heads, KVl = shares.groups, HD = c.attention_head_dim();
  const RaggedKvBatch& batch = *rt.ragged_kv;
  const std::vector<RaggedRequestKv> requests = ragged_store_kv(rt, ap, qkv, local_layer);
  const float* q = qkv.data<float>();
  const HeadLayout ql = qkv_query_layout(NHl, KVl, HD);
  Tensor out = Tensor::empty({qkv.size(0), NHl * HD});
  // Flash-decode steps (one new row) run after the loop, in parallel over the requests.
  std::vector<const RaggedRequestKv*> jobs;
  for (const RaggedRequestKv& r : requests) {
    if (batch.flash_decode_chunk > 0 && r.rows == 1) {
      jobs.push_back(&r);
      continue;
    }
    std::vector<float> lse(static_cast<size_t>(NHl * r.rows));
    rt.ops->attention_forward(r.p, q + r.row * ql.row_stride, ql, r.kv, context_key_layout(KVl, HD), r.kv,
                              context_value_layout(KVl, HD), out.data<float>() + r.row * NHl * HD, lse.data());
  }
  const int64_t n_jobs = static_cast<int64_t>(jobs.size());
#pragma omp parallel for schedule(dynamic, 1) if (n_jobs > 1)
  for (int64_t j = 0; j < n_jobs; ++j) {
    const RaggedRequestKv& r = *jobs[static_cast<size_t>(j)];
    std::vector<float> lse(static_cast<size_t>(NHl));
    flash_decode_forward(r.p, q + r.row * ql.row_stride, ql, r.kv, context_key_layout(KVl, HD), r.kv,
                         context_value_layout(KVl, HD), batch.flash_decode_chunk, out.data<float>() + r.row * NHl * HD,
                         lse.data());
  }
  return out;
}

Tensor core_attention_backward(const LayerRuntime& rt, const AttentionProblem& ap, CoreAttentionSaved& s,
                               const Tensor& ctx, const Tensor& d_ctx, float* d_softmax_offset) {
  GALE_CHECK(s.qkv.defined() && s.lse.defined()) << "core attention backward without its forward's saved state";
  const OpTable& ops = *rt.ops;
  const Plan p = plan_of(rt);
  const auto& [layout, hs, keys, B, HD, NHl, KVl, NHa, KVa, ql, kl, vl] = p;
  const Tensor d_out = hs.group ? ulysses_seq_to_heads(*hs.group, *hs.split, B, d_ctx) : d_ctx;
  const Tensor out = hs.group ? s.head_out : to_f32(ctx);  // forward's output on the rows attention ran on
  if (d_softmax_offset)  // --softmax-type learnable: this rank's rows' share (summed over CP with the gradients)
    attention_softmax_offset_backward(ap, out.data<float>(), d_out.data<float>(), s.lse.data<float>(),
                                      d_softmax_offset);
  Tensor d_qkv = Tensor::empty(s.qkv.shape());
  const float* q = s.qkv.data<float>();
  float* dq = d_qkv.data<float>();
  if (ring_keys(layout)) {  // the blocks and their gradients travel around the ring
    ring_attention_backward(*keys.group, *keys.split, rt.part->ring_options(-1), ops.attention_backward, ap, q, ql, s.ring,
                            out.data<float>(), s.lse.data<float>(), d_out.data<float>(), dq, kl, vl);
  } else if (layout == CpAttention::kAllGather || hs.kv == HeadSplitKv::kAllGather) {
    // dK, dV of every position, summed into their owners' rows
    const float* kv = s.kv_global.data<float>();
    Tensor dkv = Tensor::zeros(s.kv_global.shape());
    ops.attention_backward(ap, q, ql, kv, context_key_layout(KVa, HD), kv, context_value_layout(KVa, HD),
                           out.data<float>(), s.lse.data<float>(), d_out.data<float>(), dq, dkv.data<float>(),
                           dkv.data<float>());
    if (hs.kv == HeadSplitKv::kAllGather) {  // the queries' gradient goes back by all-to-all
      Tensor d_local = merge_heads_grad(p, d_qkv);
      reduce_scatter_context_kv_grad(*hs.group, *hs.split, B, dkv, d_local.data<float>(), kl, vl, KVa, HD);
      s = CoreAttentionSaved();
      return d_local;
    }
    reduce_scatter_context_kv_grad(*keys.group, *keys.split, B, dkv, dq, kl, vl, KVa, HD);
  } else {
    ops.attention_backward(ap, q, ql, q, kl, q, vl, out.data<float>(), s.lse.data<float>(), d_out.data<float>(),
                           dq, dq, dq);
  }
  s = CoreAttentionSaved();
  return merge_heads_grad(p, d_qkv);
}

}  // namespace gale
