// DeepSeek sparse attention's lightning indexer (--experimental-attention-variant dsa): parameters,
// the forward that picks each query's top-k keys, its KL loss and that loss's backward.
//
// Per MLA layer (Megatron-Core's DSAIndexer; NI = --dsa-indexer-n-heads, DI = --dsa-indexer-head-dim,
// R = --qk-pos-emb-head-dim ≤ DI, K = --dsa-indexer-topk):
//   qr [T, Cq]  the query latent after its norm (MLA's linear_q_up_proj input; x itself with Cq = 0)
//   x  [T, H]   the layer's attention input (input_layernorm's output)
//   q_I = linear_wq_b(qr) [T, NI·DI],  k_I = LayerNorm(linear_wk(x)) [T, DI] (weight and bias, the
//         model's --layernorm-epsilon), both with RoPE (the model's tables, rotate-half, not
//         interleaved) on the first R dims of every head (DeepSeek's layout: the rotary part first);
//   w   = linear_weights_proj(x) · NI^-1/2 · DI^-1/2 [T, NI];
//   I(i, j) = Σ_h w[i,h]·ReLU(q_I[i,h]·k_I[j]) over the layer's attention mask; top-K per query
//   (kernels/cpu/dsa.h).
// The indexer's inputs x and qr are detached: no gradient flows from the indexer into the model, and
// the indexer's parameters learn only from the KL loss
//   L_I = --dsa-indexer-loss-coeff · mean over the micro-batch's T query rows of KL(target ‖ softmax(I))
// with target the main attention's probabilities summed over heads and L1-normalised (detached too).
// Backward scales dL_I by the auxiliary losses' scale (LayerRuntime::moe_aux_scale: Megatron's
// DSAIndexerLossAutoScaler, 1/num_microbatches times the --fp16 loss scale).
//
// Parameters (Megatron names, replicated): self_attention.indexer.linear_wq_b.weight [NI·DI, Cq or H],
// .linear_wk.weight [DI, H], .k_norm.weight [DI] (ones), .k_norm.bias [DI] (zeros),
// .linear_weights_proj.weight [NI, H].
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "kernels/cpu/dsa.h"
#include "model/config.h"
#include "model/layer_runtime.h"
#include "model/params.h"

namespace gale {

struct RaggedRequestKv;  // model/core_attention.h

struct DsaIndexerIds {
  int wq_b = -1, wk = -1, k_norm_w = -1, k_norm_b = -1, weights_proj = -1;
  bool defined() const { return wq_b >= 0; }
  std::vector<int> all() const { return {wq_b, wk, k_norm_w, k_norm_b, weights_proj}; }
};

// Registers global layer `layer`'s indexer (after its MLA projections).
DsaIndexerIds register_dsa_indexer_params(ParamBuffer& pb, const ModelConfig& c, int64_t layer);

// The indexer's activations of one layer and micro-batch.
struct DsaIndexerState {
  Tensor x, qr;       // the (detached) inputs, GEMM input type
  Tensor k_pre;       // [T, DI] k_norm's input
  Tensor k_stats;     // its statistics
  Tensor q, k, w;     // [T, NI·DI], [T, DI], [T, NI] as the score uses them
  Tensor idx;         // [T, K] int32: the selected keys (kernels/cpu/dsa.h)
};

// Runs the indexer on x [T, H] and qr [T, Cq or H] and selects the top-k keys (st->idx).
void dsa_indexer_forward(const LayerRuntime& rt, const ParamBuffer& pb, const DsaIndexerIds& ids,
                         const AttentionProblem& ap, const Tensor& x, const Tensor& qr, DsaIndexerState* st);

// Decoding with a KvCache (model/kv_cache.h): x and qr hold the S new positions of B samples (at
// rt.rope_positions). Their indexer keys are written into `key_cache` (the layer's
// KvCache::indexer_keys, rows s·B + b) after the `cached` positions, and each new query picks its
// top-k among every position up to its own, cached or new (`ap`: Sq = S at the new positions
// q_positions, Sk = cached + S): the selection the whole-sequence forward makes for that row.
// Returns idx [S·B, K] (key positions, as kernels/cpu/dsa.h).
Tensor dsa_indexer_decode(const LayerRuntime& rt, const ParamBuffer& pb, const DsaIndexerIds& ids,
                          const AttentionProblem& ap, const Tensor& x, const Tensor& qr, int64_t cached,
                          Tensor& key_cache);

// Ragged decoding (rt.ragged_kv, model/kv_cache.h RaggedKvBatch): x and qr hold every request's new
// rows (at rt.rope_positions). Their indexer keys go into the request's blocks of local layer
// `local_layer` (KvBlockPool::indexer_rows), and each new query picks its top-k among its own
// request's positions up to its own (`requests`: ragged_store_kv's, in the batch's order).
// Returns idx [T, K] (key positions within each request).
Tensor dsa_indexer_ragged(const LayerRuntime& rt, const ParamBuffer& pb, const DsaIndexerIds& ids, const Tensor& x,
                          const Tensor& qr, int64_t local_layer, const std::vector<RaggedRequestKv>& requests);

// The indexer loss L_I of the micro-batch (coefficient included) against the main attention's packed
// q/k rows `teacher` (detached; MLA's padded layout).
double dsa_indexer_loss(const LayerRuntime& rt, const DsaIndexerState& st, const AttentionProblem& ap,
                        const DsaTeacher& teacher);

// Backward of L_I scaled by `scale`: accumulates the indexer's parameter gradients; releases `st`.
void dsa_indexer_backward(const LayerRuntime& rt, ParamBuffer& pb, const DsaIndexerIds& ids, const AttentionProblem& ap,
                          const DsaTeacher& teacher, double scale, DsaIndexerState& st);

// The indexer problem view of a state (for the kernels and tests).
DsaIndexerProblem dsa_indexer_problem(const ModelConfig& c, const AttentionProblem& ap, const DsaIndexerState& st);

}  // namespace gale
