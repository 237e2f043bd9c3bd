// DeepSeek sparse attention (DSA, DeepSeek-V3.2) kernels: the lightning indexer's top-k, its KL loss
// against the main attention, and attention over the selected keys — reference (level 0) and fused.
//
// Rows are the model's token rows t = s·B + b: query rows i·B + b (i < Sq), key rows j·B + b (j < Sk;
// Sk = Sq in training, and in decoding the cached positions with the new ones last, the queries at
// their positions p.q_positions). The mask (causal, sliding window, documents) is the
// AttentionProblem's: a key j is a candidate of query (b, i) when attention_visible(p, b, i, j).
//
// Lightning indexer (NI heads of width DI; q [T, NI·DI], k [T, DI], w [T, NI], all after RoPE/norm,
// w already times NI^-1/2 · DI^-1/2):
//   I(b, i, j) = Σ_h w[i,h] · ReLU(q[i,h] · k[j])                    for visible j, else −inf
// Top-k: the K visible keys of largest I (ties: the earlier key), as key indices j ascending in
// idx[t·K ..], padded with −1 when fewer than K keys are visible (K ≥ S: every visible key).
//
// Indexer loss (DeepSeek-V3.2 §2.1; Megatron's compute_dsa_indexer_loss): over the row's key set J
// (every visible key; with `sparse` only the selected ones),
//   π = softmax_J(I),   P_h = softmax_J(scale · Q_h·K_h) of each main head h,
//   target = Σ_h P_h / NH  (the heads' sum L1-normalised),
//   KL(b, i) = Σ_J target · (log(target + 1e-10) − log(π + 1e-10)).
// Forward returns Σ over rows of KL; backward, with dL/dKL(b, i) = g for every row, writes
// dq, dk, dw (the teacher gets no gradient: the main attention's q/k are detached):
//   dπ_j = −g·target_j / (π_j + 1e-10),  dI_j = π_j (dπ_j − Σ_r π_r dπ_r),
//   dw[i,h] = Σ_j dI_j·ReLU(s_hj),  ds_hj = dI_j·w[i,h]·[s_hj > 0],  dq[i,h] = Σ_j ds_hj k_j,
//   dk[j] = Σ_(i,h) ds_hj q[i,h].
//
// Sparse attention (the main MLA attention restricted to the top-k keys): per head h,
//   out[i] = Σ_{j ∈ idx(i)} softmax_j(scale · q_i·k_j) v_j,  lse[b, h, i] = log Σ exp(scale · q_i·k_j)
// in the attention kernels' layouts (AttentionProblem, HeadLayout; KV = NH: every head its keys).
// No dropout, no ALiBi (the callers refuse them). Backward is FlashAttention's with P recomputed from
// lse: dv_j += P·dout, dS = P(dout·v_j − dout·out), dq = scale·Σ dS k_j, dk_j += scale·dS q_i.
#pragma once

#include <cstdint>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/head_layout.h"

namespace gale {

// The indexer's inputs for one micro-batch: mask->B, mask->Sq queries, mask->Sk ≥ Sq keys (Sk = Sq
// but for decoding's top-k; the loss and its backward need Sk = Sq) and the visibility rules.
struct DsaIndexerProblem {
  const AttentionProblem* mask = nullptr;
  int64_t NI = 0, DI = 0;   // indexer heads and head width
  int64_t topk = 0;         // K
  const float* q = nullptr; // [Sq·B, NI·DI]
  const float* k = nullptr; // [Sk·B, DI]
  const float* w = nullptr; // [Sq·B, NI]
};

// The main attention the indexer loss learns from (detached): p->NH heads, p->HD, p->scale.
struct DsaTeacher {
  const AttentionProblem* p = nullptr;
  const float* q = nullptr;
  HeadLayout ql;
  const float* k = nullptr;
  HeadLayout kl;
};

// Index score of query row (b, i) and key j (no mask applied).
float dsa_index_score(const DsaIndexerProblem& ip, int64_t b, int64_t i, int64_t j);

// The top-k key indices idx [Sq·B, K] (row t = i·B + b; key indices j < Sk ascending, −1 padded).
void dsa_indexer_topk_ref(const DsaIndexerProblem& ip, int32_t* idx);

// Σ over rows of KL(target ‖ π) (see above); `idx` [T, K] is read only with `sparse`.
double dsa_indexer_loss_forward_ref(const DsaIndexerProblem& ip, const DsaTeacher& teacher, const int32_t* idx,
                                    bool sparse);
// Its gradient with dL/dKL = g for every row: dq [T, NI·DI], dk [T, DI], dw [T, NI] written.
void dsa_indexer_loss_backward_ref(const DsaIndexerProblem& ip, const DsaTeacher& teacher, const int32_t* idx,
                                   bool sparse, double g, float* dq, float* dk, float* dw);

// Attention of every query over its K selected keys (idx [Sq·B, K], −1 entries skipped; key j at row
// j·B + b of k and v, j < Sk: decoding reads the KV cache's rows). out in the attention kernels'
// output layout [Sq·B, NH·HD], lse [B, NH, Sq].
void dsa_sparse_attention_forward_ref(const AttentionProblem& p, const int32_t* idx, int64_t K, const float* q,
                                      const HeadLayout& ql, const float* k, const HeadLayout& kl, const float* v,
                                      const HeadLayout& vl, float* out, float* lse);
// Backward (Sk = Sq): dq written, dk and dv written (zeroed, then accumulated over the queries that chose them).
void dsa_sparse_attention_backward_ref(const AttentionProblem& p, const int32_t* idx, int64_t K, const float* q,
                                       const HeadLayout& ql, const float* k, const HeadLayout& kl, const float* v,
                                       const HeadLayout& vl, const float* out, const float* lse, const float* dout,
                                       float* dq, float* dk, float* dv);

// --use-fused-sparse-flash-attention: the same contract, computed per query row over its gathered
// keys in one pass (online softmax over blocks of the selected keys, all heads of the row at once,
// dot products and axpys vectorised), and in backward with per-thread dk/dv accumulators.
void dsa_sparse_attention_forward_fused(const AttentionProblem& p, const int32_t* idx, int64_t K, const float* q,
                                        const HeadLayout& ql, const float* k, const HeadLayout& kl, const float* v,
                                        const HeadLayout& vl, float* out, float* lse);
void dsa_sparse_attention_backward_fused(const AttentionProblem& p, const int32_t* idx, int64_t K, const float* q,
                                         const HeadLayout& ql, const float* k, const HeadLayout& kl, const float* v,
                                         const HeadLayout& vl, const float* out, const float* lse, const float* dout,
                                         float* dq, float* dk, float* dv);

}  // namespace gale
