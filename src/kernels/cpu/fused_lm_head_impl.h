// Output layer + cross-entropy without the [T, V] logits (templates over a simd type V for the row
// work; the products are p.gemm calls: OpTable::gemm, oneDNN sgemm or sgemm_partitioned).
//
// Tokens are processed in chunks of Tc rows (a [Tc, Vl] logits chunk, about kLmHeadChunkBytes):
//   forward: logits_c = x_c·Wᵀ, then per row max, Σ exp(logit − max) and the target logit.
//   eager (single vocabulary slice and dloss given at forward time, with p.dW and `saved`): the
//     chunk is turned into its gradient at once, d logits = (softmax − onehot)·dloss, then
//     dx_c = d logits·W (kept in `saved`) and dW += d logitsᵀ·x_c; no logits are ever recomputed
//     and backward only hands dx over.
//   otherwise (vocabulary split across TP ranks, where lse is known only after the all-reduce, or
//     no dloss yet): nothing is kept, and backward recomputes each chunk's logits from x and W.
// Peak extra memory: one logits chunk (+ dx [T, H] in the eager mode) instead of [T, Vl].
// p.bf16_logits (--output-logit-dtype bf16): each chunk's logits are rounded to bf16 after the GEMM
// and its gradient rows after softmax_grad_row, before the backward products.
// p.logit_softcap (--output-logit-softcapping C): each row is capped, C·tanh(z / C), after that
// rounding and before the row statistics; its gradient row is multiplied by 1 − (capped / C)²
// (a scalar loop, kernels/cpu/logit_softcap.h).
#pragma once

#include <cstring>

#include "core/check.h"
#include "core/tensor.h"
#include "kernels/cpu/fused_common_impl.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/logit_softcap.h"
#include "kernels/flop_counter.h"
#include "kernels/op_table.h"

namespace gale {
int64_t lm_head_chunk_tokens_setting();  // kernels/cpu/fused_ops.h
}

namespace gale::fused {

// Upper bound of one logits chunk: 128 MiB gives 512-token chunks at T = 1024, V = 50304. Larger
// chunks make the three GEMMs faster (eager forward+backward at T = 1024, 2 threads: 970-1005 ms
// with 256-token chunks, 935-1000 with 512, 860-905 with one 1024-token chunk) at the cost of the
// chunk's memory; 512 keeps level 2's peak under level 0's (which holds all [T, V] logits).
constexpr int64_t kLmHeadChunkBytes = 128ll << 20;

namespace {
// Tokens per chunk: at most kLmHeadChunkBytes of logits, chunks of equal size (multiples of 16).
inline int64_t lm_head_chunk_tokens(const LmHeadProblem& p) {
  const int64_t setting = lm_head_chunk_tokens_setting();
  if (setting > 0) return min_i64(setting, max_i64(p.T, 1));
  const int64_t cap = max_i64(1, kLmHeadChunkBytes / (4 * max_i64(p.Vl, 1)));
  const int64_t chunks = (p.T + cap - 1) / cap;
  int64_t tc = (p.T + chunks - 1) / max_i64(chunks, 1);
  if (tc >= 16 && (tc + 15) / 16 * 16 <= cap) tc = (tc + 15) / 16 * 16;
  return max_i64(1, min_i64(tc, p.T));
}
inline float log_f32(float x) { return __builtin_logf(x); }
// x rounded to bf16 (nearest even) in place: a bf16 tensor's values, read back as f32.
inline void round_to_bf16_inplace(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = bf16_to_float(float_to_bf16(x[i]));
}
}  // namespace

// Max of the row and Σ exp(x − max).
template <class V>
void row_max_sumexp(const float* x, int64_t n, float* max_out, float* sumexp_out) {
  using F = typename V::F;
  const float ninf = -__builtin_inff();
  F m0 = V::set1(ninf), m1 = m0, m2 = m0, m3 = m0;
  int64_t i = 0;
  for (; i + 4 * V::W <= n; i += 4 * V::W) {
    m0 = V::max(m0, V::load(x + i));
    m1 = V::max(m1, V::load(x + i + V::W));
    m2 = V::max(m2, V::load(x + i + 2 * V::W));
    m3 = V::max(m3, V::load(x + i + 3 * V::W));
  }
  for (; i < n; i += V::W) m0 = V::max(m0, V::load_n(x + i, n - i, ninf));
  const float m = V::reduce_max(V::max(V::max(m0, m1), V::max(m2, m3)));
  const F vm = V::set1(m);
  const double sum = blocked_sum<V>(n, [&](int64_t j, int64_t k) GALE_ALWAYS_INLINE {
    return simd::exp<V>(V::sub(k >= V::W ? V::load(x + j) : V::load_n(x + j, k, ninf), vm));
  });
  *max_out = m;
  *sumexp_out = static_cast<float>(sum);
}

// --output-logit-softcapping C (> 0): row = C·tanh(row / C) (then rounded again with bf16 logits).
static inline void softcap_row(float* row, int64_t n, const LmHeadProblem& p) {
  if (p.logit_softcap <= 0.0f) return;
  softcap_inplace(row, n, p.logit_softcap);
  if (p.bf16_logits) round_to_bf16_inplace(row, n);
}
// The gradient of soft-capped logits (row holds the capped logits): row = (exp(row − lse) −
// onehot(target))·d·(1 − (row / C)²), in place.
static inline void softcap_softmax_grad_row(float* row, int64_t n, float lse, float d, int64_t target_local, float cap) {
  for (int64_t i = 0; i < n; ++i) {
    const float capped = row[i];
    const float g = std::exp(capped - lse) * d - (i == target_local ? d : 0.0f);
    row[i] = softcap_grad(g, capped, cap);
  }
}

// row = (exp(row − lse) − onehot(target))·d, in place.
template <class V>
void softmax_grad_row(float* row, int64_t n, float lse, float d, int64_t target_local) {
  using F = typename V::F;
  const F vl = V::set1(lse), vd = V::set1(d);
  for_vectors<V>(n, [&](int64_t i, int64_t k) GALE_ALWAYS_INLINE {
    st<V>(row + i, V::mul(simd::exp<V>(V::sub(ld<V>(row + i, k), vl)), vd), k);
  });
  if (target_local >= 0 && target_local < n) row[target_local] -= d;
}

template <class V>
void lm_head_loss_forward(const LmHeadProblem& p, float* slice_max, float* slice_sumexp, float* target_logit,
                          Tensor* saved) {
  const bool eager = p.single_slice && p.dloss != nullptr && p.dW != nullptr && saved != nullptr;
  const int64_t tc_max = lm_head_chunk_tokens(p);
  ScratchBuffer logits(sizeof(float) * static_cast<size_t>(tc_max * p.Vl));
  float* lg = logits.floats();
  Tensor kept;
  if (eager) kept = Tensor::empty({p.T * p.H + p.T});  // dx, then the dloss it was computed with
  for (int64_t t0 = 0; t0 < p.T; t0 += tc_max) {
    const int64_t tc = min_i64(tc_max, p.T - t0);
    const float* xc = p.x + t0 * p.H;
    p.gemm(false, true, tc, p.Vl, p.H, 1.0f, xc, p.H, p.W, p.H, 0.0f, lg, p.Vl);
    parallel_for(tc, 1, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t t = t0 + r;
        float* row = lg + r * p.Vl;
        if (p.bf16_logits) round_to_bf16_inplace(row, p.Vl);
        softcap_row(row, p.Vl, p);
        row_max_sumexp<V>(row, p.Vl, &slice_max[t], &slice_sumexp[t]);
        const int64_t local = static_cast<int64_t>(p.targets[t]) - p.vocab_start;
        target_logit[t] = (local >= 0 && local < p.Vl) ? row[local] : 0.0f;
        if (eager) {
          const float lse = slice_max[t] + log_f32(slice_sumexp[t]);
          if (p.logit_softcap > 0.0f)
            softcap_softmax_grad_row(row, p.Vl, lse, p.dloss[t], local, p.logit_softcap);
          else
            softmax_grad_row<V>(row, p.Vl, lse, p.dloss[t], local);
          if (p.bf16_logits) round_to_bf16_inplace(row, p.Vl);
        }
      }
    });
    if (eager) {
      p.gemm(false, false, tc, p.H, p.Vl, 1.0f, lg, p.Vl, p.W, p.H, 0.0f, kept.data<float>() + t0 * p.H, p.H);
      p.gemm(true, false, p.Vl, p.H, tc, 1.0f, lg, p.Vl, xc, p.H, 1.0f, p.dW, p.H);
    }
  }
  if (eager) std::memcpy(kept.data<float>() + p.T * p.H, p.dloss, sizeof(float) * static_cast<size_t>(p.T));
  if (saved) *saved = kept;
}

template <class V>
void lm_head_loss_backward(const LmHeadProblem& p, const float* lse, const float* dloss, float* dx, float* dW,
                           Tensor* saved) {
  if (saved && saved->defined()) {
    // The eager forward already accumulated dW and computed dx with its dloss: that dloss must be this one.
    GALE_CHECK_EQ(saved->numel(), p.T * p.H + p.T) << "LM head backward: saved state of another problem";
    const float* kept = saved->data<float>();
    GALE_CHECK(std::memcmp(kept + p.T * p.H, dloss, sizeof(float) * static_cast<size_t>(p.T)) == 0)
        << "LM head backward: dloss differs from the dloss its forward used (the eager path finished backward "
           "in forward)";
    GALE_CHECK(p.dW == nullptr || p.dW == dW) << "LM head backward: dW differs from the forward's";
    std::memcpy(dx, kept, sizeof(float) * static_cast<size_t>(p.T * p.H));
    *saved = Tensor();
    return;
  }
  const int64_t tc_max = lm_head_chunk_tokens(p);
  ScratchBuffer logits(sizeof(float) * static_cast<size_t>(tc_max * p.Vl));
  float* lg = logits.floats();
  for (int64_t t0 = 0; t0 < p.T; t0 += tc_max) {
    const int64_t tc = min_i64(tc_max, p.T - t0);
    const float* xc = p.x + t0 * p.H;
    {
      FlopCountRecompute recompute;  // --op-cal-tflops: forward's product, run again
      p.gemm(false, true, tc, p.Vl, p.H, 1.0f, xc, p.H, p.W, p.H, 0.0f, lg, p.Vl);
    }
    parallel_for(tc, 1, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t t = t0 + r;
        float* row = lg + r * p.Vl;
        if (p.bf16_logits) round_to_bf16_inplace(row, p.Vl);
        softcap_row(row, p.Vl, p);
        const int64_t local = static_cast<int64_t>(p.targets[t]) - p.vocab_start;
        if (p.logit_softcap > 0.0f)
          softcap_softmax_grad_row(row, p.Vl, lse[t], dloss[t], local, p.logit_softcap);
        else
          softmax_grad_row<V>(row, p.Vl, lse[t], dloss[t], local);
        if (p.bf16_logits) round_to_bf16_inplace(row, p.Vl);
      }
    });
    p.gemm(false, false, tc, p.H, p.Vl, 1.0f, lg, p.Vl, p.W, p.H, 0.0f, dx + t0 * p.H, p.H);
    if (dW) p.gemm(true, false, p.Vl, p.H, tc, 1.0f, lg, p.Vl, xc, p.H, 1.0f, dW, p.H);
  }
  if (saved) *saved = Tensor();
}

}  // namespace gale::fused
