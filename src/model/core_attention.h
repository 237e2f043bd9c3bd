// One layer's core attention (QKV rows in, context rows out) under every context-parallel layout.
//
// The layer hands over its packed QKV rows [T, (NHl + 2·KVl)·HD] (after RoPE) for this rank's
// positions and gets back the attention output [T, NHl·HD] for the same rows. In between, the
// layout of --context-parallel-size / --context-parallel-algo / --cp-comm-type decides two things:
//
//   1. a head split (Ulysses): an all-to-all first trades the sequence split for a split of whole
//      KV groups over `degree` ranks (ulysses_cp_algo: the cp group; hybrid_cp_algo: the Ulysses
//      sub-group of U ranks), so attention sees more positions for fewer heads; the output goes
//      back by the inverse all-to-all (model/context_parallel.h);
//   2. where the keys and values come from, for the rows attention then holds:
//      - local: they are the rows themselves (no CP, or Ulysses: whole sequences);
//      - all-gather: gathered from the cp group, dK/dV reduce-scattered back (model/context_parallel.h);
//      - ring: fetched block by block around a ring (the cp group, or hybrid's ring sub-group;
//        model/ring_attention.h).
//
//   layout (CpAttention)  head split               keys and values
//   kNone                 none                     local
//   kAllGather            none                     all-gather over cp
//   kRing                 none                     ring over cp
//   kUlysses              all-to-all over cp       local (whole sequences)
//   kHybrid               all-to-all over Ulysses  ring over the ring sub-group
//
// Every path gives the single-process result (tests/parallel/invariance_mpi_test.cc); dropout and
// masks use global positions (AttentionProblem), so they do not depend on the layout.
#pragma once

#include <vector>

#include "core/tensor.h"
#include "model/layer_runtime.h"
#include "model/ring_attention.h"

namespace gale {

enum class CpAttention { kNone, kAllGather, kRing, kUlysses, kHybrid };

// The layout of `part` for a micro-batch split by `split` (kNone when split.cp_size is 1).
CpAttention cp_attention_of(const ModelPartition& part, const ContextSplit& split);

// The key/value heads attention sees on each rank after a Ulysses head split of KVl groups over
// `degree` ranks: whole groups (KVl / degree), or one repeated group when KVl < degree (MindSpeed's
// repeat all-to-all; --use-ulysses-allgather-kv keeps all KVl = 1).
inline int64_t ulysses_kv_heads(int64_t KVl, int64_t degree) { return KVl % degree == 0 ? KVl / degree : 1; }

// What forward keeps for backward. Shapes are those of the rows attention ran on: this rank's
// T = S·B rows without a head split; Ulysses S_global·B rows for NHl/CP heads; hybrid
// S_global/R·B rows (its ring block, R = CP/U) for NHl/U heads.
struct CoreAttentionSaved {
  Tensor qkv;        // packed QKV rows after RoPE [rows, (NHa + 2·KVa)·HD]
  Tensor lse;        // [B, NHa, rows/B]
  Tensor kv_global;  // kAllGather: keys and values of the whole sequence [S_global·B, 2·KVl·HD]
  RingSaved ring;    // kRing, kHybrid: this rank's key/value block [rows, 2·KVa·HD] (and the blocks or keys
                     // received, under --context-parallel-kv-cache-policy; model/ring_attention.h)
  Tensor head_out;   // kUlysses, kHybrid: attention's output on the head split [rows, NHa·HD]
};

// qkv [T, (NHl + 2·KVl)·HD] after RoPE -> the attention output [T, NHl·HD] (f32). `ap` is the
// micro-batch's problem with this layer's dropout stream; `layer` the global layer index (it picks
// the layers whose ring keeps a key/value cache, --context-parallel-cache-interval). With `saved`
// null nothing is kept.
Tensor core_attention_forward(const LayerRuntime& rt, const AttentionProblem& ap, int64_t layer, const Tensor& qkv,
                              CoreAttentionSaved* saved);

// The rows core_attention_forward keeps as saved.qkv for the layer's packed rows `qkv` (after
// RoPE): qkv itself, or under a Ulysses head split its all-to-all (every rank of the group must
// call). For a layer that dropped saved.qkv after forward and rebuilds it before backward
// (--recompute-modules mla_up_proj).
Tensor core_attention_kept_qkv(const LayerRuntime& rt, const Tensor& qkv);

// Incremental decoding (rt.kv_cache set, no context parallelism): the keys and values of qkv's rows
// (the new positions) are written into `cache` (one layer's KvCache rows) after the cached ones, and
// the new queries attend to every position up to their own. Returns [T, NHl·HD]; keeps nothing.
Tensor cached_attention_forward(const LayerRuntime& rt, const AttentionProblem& ap, const Tensor& qkv, Tensor& cache);

// Its first half, for a layer that attends to the cache its own way (DSA's sparse attention,
// model/mla_attention.h): the keys and values of qkv's rows written into `cache` after the
// rt.kv_cache->length cached positions (a GALE_CHECK that they fit).
void append_to_kv_cache(const LayerRuntime& rt, const Tensor& qkv, Tensor& cache);

// One request of a ragged batch after ragged_store_kv: its rows [row, row + rows) of the
// micro-batch, the keys and values of its positions [0, L = cached + rows) in one piece (kv, [L, 2·KVl·HD]
// rows; `gathered` owns them when they span blocks), and the attention problem of its rows (B 1,
// Sq rows at `positions`, Sk L).
struct RaggedRequestKv {
  int64_t row = 0, rows = 0, L = 0;
  const float* kv = nullptr;
  Tensor gathered;
  std::vector<int32_t> positions;
  AttentionProblem p;
};

// Ragged decoding (rt.ragged_kv set; one sample of rows, no context or tensor-sequence split): writes
// each request's new keys and values (of qkv's rows) into its blocks of local layer `local_layer`
// and returns every request's keys and values and attention problem (`ap` with the request's
// sizes and positions; p.q_positions points into `positions`). GALE_CHECKs that the blocks hold
// the positions and that the requests cover qkv's rows.
std::vector<RaggedRequestKv> ragged_store_kv(const LayerRuntime& rt, const AttentionProblem& ap, const Tensor& qkv,
                                             int64_t local_layer);

// Ragged decoding (rt.ragged_kv set; one sample of rows, no context or tensor-sequence split):
// each request's rows write their keys and values into its blocks of local layer `local_layer`
// (ragged_store_kv) and attend to its positions [0, cached + rows) at their own positions
// (model/kv_cache.h RaggedKvBatch). The requests with one new row attend with flash_decode_forward when
// flash_decode_chunk > 0, after the others and in parallel over the requests.
Tensor ragged_attention_forward(const LayerRuntime& rt, const AttentionProblem& ap, const Tensor& qkv,
                                int64_t local_layer);

// Backward of core_attention_forward: `ctx` is the output forward returned (f32, or the bf16 copy
// the layer kept as a GEMM input), d_ctx its gradient [T, NHl·HD]. Returns dQKV [T, (NHl + 2·KVl)·HD]
// (before RoPE's backward) and releases `saved`. With sink logits (ap.softmax_offset, --softmax-type
// learnable) `d_softmax_offset` (non-null) ACCUMULATES their gradient [ap.NH] from this rank's rows
// (kernels/cpu/attention.h attention_softmax_offset_backward; under context parallelism each rank's
// share, summed by the gradients' data-parallel × context-parallel reduction).
Tensor core_attention_backward(const LayerRuntime& rt, const AttentionProblem& ap, CoreAttentionSaved& saved,
                               const Tensor& ctx, const Tensor& d_ctx, float* d_softmax_offset = nullptr);

}  // namespace gale
