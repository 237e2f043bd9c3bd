// Scaled dot-product attention with causal / document / sliding-window masks, GQA and dropout: reference kernels.
//
// Queries, keys and values are read in place through HeadLayouts (e.g. straight out of the packed
// QKV rows); tokens are t = s·B + b. Query head h reads key/value head h / (NH/KV).
// Forward writes out[Sq·B, NH·HD] (row t = s·B + b, head h at columns [h·HD, (h+1)·HD)) and
// lse[B, NH, Sq] = logsumexp of each query's scaled, masked scores (−inf for a query that may see
// no key; with sink logits, AttentionProblem::softmax_offset, the sink's exp is in the sum). Backward recomputes the probabilities from lse (no [S, S] tensor is kept between
// forward and backward) and WRITES dq, dk, dv (same layouts as q, k, v; the caller zeroes nothing).
//
// The reference computes each (batch, head) with full [Sq, Sk] score matrices and BLAS calls;
// fused/tiled versions (flash attention) must match it (tests/kernels).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/head_layout.h"

namespace gale {

struct AttentionProblem {
  int64_t B = 0, Sq = 0, Sk = 0, NH = 0, KV = 0, HD = 0;
  float scale = 1.0f;  // usually 1/sqrt(HD)
  bool causal = true;  // a key is visible when its position <= the query's position
  // Sliding window W (0: none; --sliding-window): a key is visible only when
  // query position − key position < W, i.e. the query sees itself and the W − 1 keys before it.
  // This is Hugging Face Mistral's mask (transformers' sliding_window_overlay: kv_idx > q_idx − W,
  // AND-ed with the causal mask; flash-attn's window_size = (W − 1, 0)). Keys ahead of the query
  // are left to `causal`. Combines with the document mask and GQA; uses the positions below, so
  // context parallelism and KV-cache decoding see the window at global positions.
  int64_t window = 0;
  // Logit soft-capping C (0: none; Gemma-2's --attn-logit-softcapping): every score s = scale·q·k
  // becomes C·tanh(s / C) before the ALiBi bias, the masks and the softmax; backward multiplies dS
  // by 1 − tanh²(s / C). lse and --log-max-attention-logit see the capped scores.
  float softcap = 0.0f;
  // Positions of the query rows / key rows (nullptr: 0..Sq-1 / 0..Sk-1). Used by the causal and
  // window masks and by dropout; context parallelism passes the global positions of its chunks.
  const int32_t* q_positions = nullptr;
  const int32_t* k_positions = nullptr;
  // Document ids [B, Sq] / [B, Sk] (nullptr: one document): a key is visible only when its id
  // equals the query's (--reset-attention-mask).
  const int32_t* q_doc_ids = nullptr;
  const int32_t* k_doc_ids = nullptr;
  // ALiBi (--position-embedding-type alibi; Press et al., Bloom): the slopes of ALL heads
  // [heads_total] (null: no bias). Local head h uses m = alibi_slopes[head_offset + h] (its global
  // head index, so tensor / Ulysses head splits need nothing else) and every visible score gets
  //   score(i, j) = scale·q_i·k_j + m·(kpos_j − qpos_i)
  // computed as m·float(kpos − qpos) after the scale, before the masks and the softmax (a key never
  // ahead of a causal query: the bias is −m·distance ≤ 0). It uses the positions above, so context
  // parallelism and KV-cache decoding see it at global positions, and document masks only hide keys
  // (within a row the bias differs from Bloom's m·kpos by the constant m·qpos, which the softmax
  // cancels). The slopes are constants: no gradient flows to them.
  const float* alibi_slopes = nullptr;
  // --softmax-type off-by-one / learnable (Megatron-Core's softmax_offset; attention sinks, gpt-oss):
  // one extra logit σ_h per head [NH] (null: vanilla softmax), indexed by the problem's head h
  // (callers point at the heads they run). It joins every query's softmax as a virtual key with no
  // value: P_ij = exp(s_ij) / (exp(σ_h) + Σ_j' exp(s_ij')), so a row's probabilities sum to less
  // than 1 and a query that sees no key gets out = 0. lse includes it (lse = log(exp(σ_h) + Σ_j
  // exp(s_ij)), never −inf), which is all backward needs: P = exp(S − lse) and dS = P∘(dP − δ) are
  // unchanged, so the backward kernels do not read it. Its own gradient is
  // attention_softmax_offset_backward's. Off-by-one is σ = 0 (Evan Miller's softmax_1).
  const float* softmax_offset = nullptr;
  // Dropout on the probabilities: element (sample, head, q position, k position) is kept when
  // dropout_uniform_at(dropout_seed, dropout_stream, index) >= dropout_p (core/rng.h: word index & 3
  // of the Philox block at counter index >> 2), where
  // index = ((sample_ids[b]·heads_total + head_offset + h)·max_positions + qpos)·max_positions + kpos.
  float dropout_p = 0.0f;
  uint64_t dropout_seed = 0;
  uint64_t dropout_stream = 0;
  const int64_t* sample_ids = nullptr;  // [B] global sample index of each batch row
  int64_t heads_total = 0;              // NH over all TP ranks
  int64_t head_offset = 0;              // global index of local head 0
  int64_t max_positions = 0;            // positions are < this
};

// ALiBi slopes of n heads: with p the largest power of two ≤ n, head i < p gets 2^(−8(i+1)/p); the
// n − p remaining heads get the odd powers 2^(−8(2k+1)/(2p)), k = 0, 1, ... (the slopes of 2p heads
// at even indices), Press et al.'s get_slopes and Hugging Face Bloom's build_alibi_tensor.
std::vector<float> alibi_slopes(int64_t n);

// True when query (b, i) may attend key (b, j).
bool attention_visible(const AttentionProblem& p, int64_t b, int64_t i, int64_t j);

void attention_forward_ref(const AttentionProblem& p, const float* q, const HeadLayout& ql, const float* k,
                           const HeadLayout& kl, const float* v, const HeadLayout& vl, float* out, float* lse);

void attention_backward_ref(const AttentionProblem& p, const float* q, const HeadLayout& ql, const float* k,
                            const HeadLayout& kl, const float* v, const HeadLayout& vl, const float* out,
                            const float* lse, const float* dout, float* dq, float* dk, float* dv);

// --qk-clip / --log-max-attention-logit (Megatron-Core's MuonClip statistic, Transformer Engine's
// return_max_logit): for each head h of the problem, the largest pre-softmax logit
//   max over (b, i, visible j) of scale·q_i·k_j (+ ALiBi's bias, as the softmax sees it)
// MERGED into max_logit[h] (max_logit[h] = max(max_logit[h], that); a head none of whose queries
// sees a key leaves it unchanged). Masked pairs, the sink logit and dropout take no part. One extra
// pass over the scores, the same at every optimisation level (the flash kernels' scores are those
// of this function up to rounding of the order of summation).
void attention_max_logit_ref(const AttentionProblem& p, const float* q, const HeadLayout& ql, const float* k,
                             const HeadLayout& kl, float* max_logit);

// Folds the sink logits p.softmax_offset into a result computed without them (ring attention's
// merged blocks, flash decoding's merged chunks): per (b, h, query) lse' = log(exp(lse) + exp(σ_h)),
// out ·= exp(lse − lse') (a row with lse −inf gets out 0 and lse σ_h). out [Sq·B, NH·HD], lse
// [B, NH, Sq] as attention_forward_ref writes them. Nothing to do without sinks.
void attention_softmax_offset_merge(const AttentionProblem& p, float* out, float* lse);

// Gradient of the sink logits (--softmax-type learnable): with P_sink = exp(σ_h − lse) the sink's
// share of each row and δ = dO·O,
//   d_offset[h] += −Σ_(b, i) P_sink(b, h, i) · δ(b, h, i)
// (ds_sink = P_sink·(dP_sink − δ) with dP_sink = 0: the sink has no value). out / dout / lse as
// attention_backward_ref reads them (lse including the sink, O after dropout); ACCUMULATES into
// d_offset [NH] (a parameter gradient), summed in double per head.
void attention_softmax_offset_backward(const AttentionProblem& p, const float* out, const float* dout,
                                       const float* lse, float* d_offset);

}  // namespace gale
