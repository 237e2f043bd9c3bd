// Core attention under the context-parallel layouts: head split, then local / all-gather / ring keys.
#include "model/core_attention.h"

#include <algorithm>

#include "core/check.h"
#include "model/context_parallel.h"
#include "model/layer_shares.h"
#include "model/linear.h"
#include "model/ring_attention.h"

namespace gale {

namespace {

// The Ulysses all-to-all of a layout: the group, its split and degree (group null: no head split).
struct HeadSplit {
  Communicator* group = nullptr;
  const ContextSplit* split = nullptr;
  int64_t degree = 1;
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
// packed-QKV layouts of the rows attention runs on (NHa, KVa: this rank's heads after any head split).
struct Plan {
  CpAttention layout;
  HeadSplit hs;
  KeySource keys;
  int64_t B, HD, NHa, KVa;
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
  p.NHa = shares.heads / p.hs.degree;
  p.KVa = shares.groups / p.hs.degree;
  p.ql = qkv_query_layout(p.NHa, p.KVa, p.HD);
  p.kl = qkv_key_layout(p.NHa, p.KVa, p.HD);
  p.vl = qkv_value_layout(p.NHa, p.KVa, p.HD);
  return p;
}

}  // namespace

Tensor core_attention_forward(const LayerRuntime& rt, const AttentionProblem& ap, int64_t layer, const Tensor& qkv_local,
                              CoreAttentionSaved* saved) {
  const OpTable& ops = *rt.ops;
  const Plan p = plan_of(rt);
  const auto& [layout, hs, keys, B, HD, NHa, KVa, ql, kl, vl] = p;
  const Tensor qkv = hs.group ? ulysses_seq_to_heads(*hs.group, *hs.split, B, qkv_local) : qkv_local;
  const int64_t rows = qkv.size(0);
  Tensor out = Tensor::empty({rows, NHa * HD});
  Tensor lse = Tensor::empty({B, NHa, rows / B});
  Tensor kv_global;
  RingSaved ring;
  const float* q = qkv.data<float>();
  if (ring_keys(layout)) {
    // The cache serves only a backward: without `saved` nothing is kept.
    const RingOptions opts = rt.part->ring_options(saved ? layer : -1);
    ring = ring_attention_forward(*keys.group, *keys.split, opts, ops.attention_forward, ap, q, ql, kl, vl,
                                  out.data<float>(), lse.data<float>());
  } else if (layout == CpAttention::kAllGather) {
    kv_global = all_gather_context_kv(*keys.group, *keys.split, B, q, kl, vl, KVa, HD);
    const float* kv = kv_global.data<float>();
    ops.attention_forward(ap, q, ql, kv, context_key_layout(KVa, HD), kv, context_value_layout(KVa, HD),
                          out.data<float>(), lse.data<float>());
  } else {
    ops.attention_forward(ap, q, ql, q, kl, q, vl, out.data<float>(), lse.data<float>());
  }
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
  return p.hs.group ? ulysses_seq_to_heads(*p.hs.group, *p.hs.split, p.B, qkv) : qkv;
}

Tensor cached_attention_forward(const LayerRuntime& rt, const AttentionProblem& ap, const Tensor& qkv, Tensor& cache) {
  const ModelConfig& c = *rt.config;
  const LayerShares shares = layer_shares(c, *rt.part);
  const int64_t B = rt.mb->B, S = rt.mb->S, HD = c.attention_head_dim();
  const int64_t NHl = shares.heads, KVl = shares.groups, first = rt.kv_cache->length;
  GALE_CHECK(rt.cp_split.cp_size == 1 && B == rt.kv_cache->B && first + S <= rt.kv_cache->max_length)
      << "kv cache: " << first << " + " << S << " positions of " << B << " samples in a cache of "
      << rt.kv_cache->max_length << " x " << rt.kv_cache->B;
  const float* q = qkv.data<float>();
  const HeadLayout ql = qkv_query_layout(NHl, KVl, HD);
  const Tensor kv_new = pack_context_kv(S * B, q, qkv_key_layout(NHl, KVl, HD), qkv_value_layout(NHl, KVl, HD), KVl, HD);
  std::copy_n(kv_new.data<float>(), kv_new.numel(), cache.data<float>() + first * B * kv_new.size(1));
  Tensor out = Tensor::empty({S * B, NHl * HD});
  Tensor lse = Tensor::empty({B, NHl, S});
  const float* kv = cache.data<float>();
  rt.ops->attention_forward(ap, q, ql, kv, context_key_layout(KVl, HD), kv, context_value_layout(KVl, HD),
                            out.data<float>(), lse.data<float>());
  return out;
}

Tensor core_attention_backward(const LayerRuntime& rt, const AttentionProblem& ap, CoreAttentionSaved& s,
                               const Tensor& ctx, const Tensor& d_ctx) {
  GALE_CHECK(s.qkv.defined() && s.lse.defined()) << "core attention backward without its forward's saved state";
  const OpTable& ops = *rt.ops;
  const Plan p = plan_of(rt);
  const auto& [layout, hs, keys, B, HD, NHa, KVa, ql, kl, vl] = p;
  const Tensor d_out = hs.group ? ulysses_seq_to_heads(*hs.group, *hs.split, B, d_ctx) : d_ctx;
  const Tensor out = hs.group ? s.head_out : to_f32(ctx);  // forward's output on the rows attention ran on
  Tensor d_qkv = Tensor::empty(s.qkv.shape());
  const float* q = s.qkv.data<float>();
  float* dq = d_qkv.data<float>();
  if (ring_keys(layout)) {  // the blocks and their gradients travel around the ring
    ring_attention_backward(*keys.group, *keys.split, rt.part->ring_options(-1), ops.attention_backward, ap, q, ql, s.ring,
                            out.data<float>(), s.lse.data<float>(), d_out.data<float>(), dq, kl, vl);
  } else if (layout == CpAttention::kAllGather) {  // dK, dV of every position, summed into their owners' rows
    const float* kv = s.kv_global.data<float>();
    Tensor dkv = Tensor::zeros(s.kv_global.shape());
    ops.attention_backward(ap, q, ql, kv, context_key_layout(KVa, HD), kv, context_value_layout(KVa, HD),
                           out.data<float>(), s.lse.data<float>(), d_out.data<float>(), dq, dkv.data<float>(),
                           dkv.data<float>());
    reduce_scatter_context_kv_grad(*keys.group, *keys.split, B, dkv, dq, kl, vl, KVa, HD);
  } else {
    ops.attention_backward(ap, q, ql, q, kl, q, vl, out.data<float>(), s.lse.data<float>(), d_out.data<float>(),
                           dq, dq, dq);
  }
  s = CoreAttentionSaved();
  return hs.group ? ulysses_heads_to_seq(*hs.group, *hs.split, B, d_qkv) : d_qkv;
}

}  // namespace gale
