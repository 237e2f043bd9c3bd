// Split-K flash decoding (Megatron's --flash-decode): the attention of one new query token over a
// long key/value sequence, the keys cut into chunks that are reduced independently and then merged.
//
// For each query head h (key/value head h / (NH/KV), GQA) and chunk c = keys [c·C, min(L, (c+1)·C)):
//   m_c = max_j s_j,  l_c = Σ_j exp(s_j − m_c),  a_c = Σ_j exp(s_j − m_c)·v_j     (visible keys j only)
// with s_j = scale·q·k_j (+ the ALiBi bias m_h·(kpos_j − qpos)); then, with M = max_c m_c,
//   out = Σ_c exp(m_c − M)·a_c / Σ_c exp(m_c − M)·l_c,   lse = M + log Σ_c exp(m_c − M)·l_c.
// Chunks without a visible key (m_c = −inf) drop out; a query that sees no key gets out = 0 and
// lse = −inf (as attention_forward). Sink logits (p.softmax_offset) enter the merge once: M starts
// at σ_h and the denominator at exp(σ_h − M). The chunks run in parallel (OpenMP over heads × chunks), which
// is what makes a single query over thousands of keys use every core. The masks are those of
// AttentionProblem (causal and sliding window at p.q_positions[0] / p.k_positions, ALiBi); the
// problem must be one sample with one query (B = Sq = 1), no dropout, no document ids.
// flash_decode_forward_ref is the plain one-pass softmax in double precision that the chunked
// kernel is tested against (tests/kernels/flash_decode_test.cc).
#pragma once

#include <cstdint>

#include "kernels/cpu/attention.h"

namespace gale {

// out[NH·HD] and lse[NH] of the query row q (layout ql, token 0) over p.Sk keys/values (layouts kl,
// vl, tokens 0..Sk-1), the keys split into chunks of `chunk` (> 0) positions.
void flash_decode_forward(const AttentionProblem& p, const float* q, const HeadLayout& ql, const float* k,
                          const HeadLayout& kl, const float* v, const HeadLayout& vl, int64_t chunk, float* out,
                          float* lse);

// The same result without chunks, accumulated in double.
void flash_decode_forward_ref(const AttentionProblem& p, const float* q, const HeadLayout& ql, const float* k,
                              const HeadLayout& kl, const float* v, const HeadLayout& vl, float* out, float* lse);

}  // namespace gale
