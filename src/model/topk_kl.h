// Megatron-LM's offline-distillation loss (--logits-load-dir): the forward KL of a teacher's saved
// top-K log-probabilities from the student's distribution, with the "ghost" token, and its gradient.
//
// Megatron (megatron/training/distillation/cached_logits_loss.py, topk_kl_div with
// add_ghost_token=True, the only way its training loss calls it). For token t with student logits
// s[t, ·] over the whole vocabulary and the teacher's K saved entries (log-probability lp_k at
// vocabulary index i_k, already log-softmaxed over the teacher's whole vocabulary when saved):
//   ls_v = s_v − log Σ_u exp(s_u)                         (student log-probabilities, no temperature)
//   m_k  = [lp_k ≠ −1000]                                 (the top-P sentinel entries count for nothing)
//   S    = Σ_k m_k · exp(ls_{i_k})                        (student mass on the teacher's support)
//   sr   = log(max(1 − S, 1e−8)),  tr = log(max(1 − Σ_k exp(lp_k), 1e−8))   (the ghost token)
//   kl_t = Σ_k m_k · exp(lp_k) · (lp_k − ls_{i_k}) + exp(tr) · (tr − sr)
// The teacher's probabilities are not renormalised over the support: the ghost token carries the
// mass outside it on both sides. Where 1 − S is clamped the ghost term's gradient is 0 (as
// torch.clamp's). The gradient with respect to s_v, with q = softmax(s), P_v = Σ_k m_k·exp(lp_k)·[i_k = v],
// Q_v = q_v·[v in the masked support], M = Σ_k m_k·exp(lp_k):
//   d kl_t / d s_v = q_v·M − P_v + [1 − S > 1e−8] · exp(tr) / (1 − S) · (Q_v − q_v·S)
// Megatron computes in float32; Gale in float64 from the float32 logits.
//
// Vocabulary parallelism (Megatron's TP-aware path): this rank holds columns [offset, offset + V) of
// each row; every rank holds the teacher's whole top-K. The row maxima, exponential sums, S and the
// per-token KL are all-reduced (the ghost term counted on the first rank only), so kl[t] is the
// whole-vocabulary value on every rank and d this rank's columns of the whole gradient.
#pragma once

#include <cstdint>

#include "model/logits_kl.h"  // KlAllReduce

namespace gale {

// Megatron's CACHED_LOGITS_LOGPROB_SENTINEL: the saved log-probability of a top-P-masked entry.
inline constexpr float kCachedLogitsLogprobSentinel = -1000.0f;
// The clamp of both ghost-token residual masses (Megatron's eps).
inline constexpr double kGhostTokenEps = 1e-8;

// The teacher's saved top-K of T tokens: log-probabilities and global vocabulary indices, [T, K]
// row-major (token t = s·B + b, Megatron's [S, B, K]).
struct TeacherTopK {
  const float* logprobs = nullptr;
  const int64_t* indices = nullptr;
  int64_t K = 0;
};

// kl[t] for the T rows of student [T, V] (this rank's columns from vocab_offset) and, where d is
// not null, d[t, ·] = coef[t] · d kl_t / d s[t, ·] (written; rows with coef[t] == 0 are zeroed).
// `first_rank`: this rank adds the ghost term (TP rank 0; true without TP). all_reduce null: one rank
// holds the whole vocabulary (vocab_offset 0).
void topk_kl_forward_backward(const float* student, int64_t T, int64_t V, int64_t vocab_offset,
                              const TeacherTopK& teacher, const float* coef, double* kl, float* d,
                              bool first_rank = true, const KlAllReduce& all_reduce = nullptr);

}  // namespace gale
