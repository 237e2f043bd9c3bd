// Vectorised embedding lookup/gradient, AdamW step and the gradient-norm reduction (templates over
// a simd type V).
//
// Both keep the reference's arithmetic and summation order (kernels/cpu/embedding.h, optimizer.h),
// so on this build they are bit-identical to it; they are memory-bound, and the gain is wider
// loads/stores and one pass.
#pragma once

#include <cstring>

#include "kernels/cpu/fused_common_impl.h"
#include "kernels/cpu/optimizer.h"

namespace gale::fused {

template <class V>
void embedding_forward(const int32_t* ids, int64_t T, const float* W, int64_t vocab_start, int64_t Vl, int64_t H,
                       float* out) {
  parallel_for(T, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t local = static_cast<int64_t>(ids[t]) - vocab_start;
      if (local >= 0 && local < Vl)
        std::memcpy(out + t * H, W + local * H, sizeof(float) * static_cast<size_t>(H));
      else
        std::memset(out + t * H, 0, sizeof(float) * static_cast<size_t>(H));
    }
  });
}

// Parallel over column blocks: every thread visits the tokens in order, so repeated ids never race
// and each element's sum order is fixed.
template <class V>
void embedding_backward(const int32_t* ids, int64_t T, const float* dout, int64_t vocab_start, int64_t Vl, int64_t H,
                        float* dW) {
  parallel_for(H, 64, [&](int64_t c0, int64_t c1) {
    for (int64_t t = 0; t < T; ++t) {
      const int64_t local = static_cast<int64_t>(ids[t]) - vocab_start;
      if (local < 0 || local >= Vl) continue;
      add_into<V>(dW + local * H + c0, dout + t * H + c0, c1 - c0);
    }
  });
}

// One AdamW pass over [0, n); with `s` (kEma) also the EMA of the updated parameters,
// s = d·s + (1 − d)·p_new (ema_adamw_step_ref's arithmetic). Same operations in the same order as
// adamw_step_ref, so bit-identical to it.
template <class V, bool kEma>
GALE_ALWAYS_INLINE inline void adamw_pass(float* p, const float* g, float* m, float* v, float* s, int64_t n,
                                          const AdamWHyper& h, float ema_decay) {
  using F = typename V::F;
  const float bc1 = 1.0f - __builtin_powf(h.beta1, static_cast<float>(h.step));
  const float bc2 = 1.0f - __builtin_powf(h.beta2, static_cast<float>(h.step));
  const F b1 = V::set1(h.beta1), b2 = V::set1(h.beta2), c1 = V::set1(1.0f - h.beta1), c2 = V::set1(1.0f - h.beta2);
  const F vbc1 = V::set1(bc1), vbc2 = V::set1(bc2), eps = V::set1(h.eps), wd = V::set1(h.weight_decay);
  const F lr = V::set1(h.lr), grad_scale = V::set1(h.grad_scale);
  const F keep = V::set1(ema_decay), take = V::set1(1.0f - ema_decay);
  parallel_for(n, 1 << 15, [&](int64_t b, int64_t e) {
    for_vectors<V>(e - b, [&](int64_t i0, int64_t k) GALE_ALWAYS_INLINE {
      const int64_t i = b + i0;
      const F gv = V::mul(ld<V>(g + i, k), grad_scale), pv = ld<V>(p + i, k);
      const F mv = V::add(V::mul(b1, ld<V>(m + i, k)), V::mul(c1, gv));
      const F vv = V::add(V::mul(b2, ld<V>(v + i, k)), V::mul(V::mul(c2, gv), gv));
      const F denom = V::add(V::sqrt(V::div(vv, vbc2)), eps);
      const F update = V::add(V::div(V::div(mv, vbc1), denom), V::mul(wd, pv));
      const F pn = V::sub(pv, V::mul(lr, update));
      st<V>(m + i, mv, k);
      st<V>(v + i, vv, k);
      st<V>(p + i, pn, k);
      if constexpr (kEma) st<V>(s + i, V::add(V::mul(keep, ld<V>(s + i, k)), V::mul(take, pn)), k);
    });
  });
}

template <class V>
void adamw_step(float* p, const float* g, float* m, float* v, int64_t n, const AdamWHyper& h) {
  adamw_pass<V, false>(p, g, m, v, nullptr, n, h, 0.0f);
}

// adamw_step and the EMA of the updated parameters in the same pass.
template <class V>
void ema_adamw_step(float* p, const float* g, float* m, float* v, float* s, int64_t n, const AdamWHyper& h,
                    float ema_decay) {
  adamw_pass<V, true>(p, g, m, v, s, n, h, ema_decay);
}

// Σ x² over [0, len) in blocks of kSumBlock elements, each summed in four float-vector chains (one
// chain waits on the add latency: the scalar build ran 2.4x faster with four) that are added
// pairwise; blocks are added in double.
template <class V>
GALE_ALWAYS_INLINE inline double sum_of_squares_chunk(const float* x, int64_t len) {
  using F = typename V::F;
  static_assert(kSumBlock % (4 * V::W) == 0, "a block is a whole number of 4-vector steps");
  double total = 0.0;
  int64_t b = 0;
  for (; b + kSumBlock <= len; b += kSumBlock) {
    F a0 = V::zero(), a1 = V::zero(), a2 = V::zero(), a3 = V::zero();
    for (int64_t i = b; i < b + kSumBlock; i += 4 * V::W) {
      const F v0 = V::load(x + i), v1 = V::load(x + i + V::W), v2 = V::load(x + i + 2 * V::W),
              v3 = V::load(x + i + 3 * V::W);
      a0 = V::fmadd(v0, v0, a0);
      a1 = V::fmadd(v1, v1, a1);
      a2 = V::fmadd(v2, v2, a2);
      a3 = V::fmadd(v3, v3, a3);
    }
    total += V::reduce_add(V::add(V::add(a0, a1), V::add(a2, a3)));
  }
  if (b < len) {
    F acc = V::zero();
    for_vectors_in<V>(b, len, [&](int64_t i, int64_t k) GALE_ALWAYS_INLINE {
      const F v = ld<V>(x + i, k);
      acc = V::fmadd(v, v, acc);
    });
    total += V::reduce_add(acc);
  }
  return total;
}

// Σ x² over the reference's fixed 64 Ki-element chunks (kernels/cpu/optimizer.cc), each summed in
// float vectors within blocks of kSumBlock elements and in double across blocks; chunk partials
// are added in order, so the result does not depend on the thread count.
template <class V>
double sum_of_squares(const float* x, int64_t n) {
  constexpr int64_t kChunk = 1 << 16;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  ScratchBuffer partial(sizeof(double) * static_cast<size_t>(chunks > 0 ? chunks : 1));
  double* part = partial.as<double>();
  parallel_for(chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const float* xc = x + c * kChunk;
      part[c] = sum_of_squares_chunk<V>(xc, min_i64(kChunk, n - c * kChunk));
    }
  });
  double total = 0.0;
  for (int64_t c = 0; c < chunks; ++c) total += part[c];
  return total;
}

}  // namespace gale::fused
