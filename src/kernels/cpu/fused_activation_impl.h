// Fused MLP activations (templates over a simd type V): bias + exact-erf GeLU, bias + SwiGLU and
// bias + the gated GLU of GluSpec (quick-GEGLU, linear offset, clamp),
// forward in one pass (the bias is added to u in place, as the OpTable entry requires) and
// backward with the bias gradient summed in the same pass over fixed row chunks.
#pragma once

#include "kernels/cpu/activation.h"
#include "kernels/cpu/fused_common_impl.h"

namespace gale::fused {

template <class V>
void gelu_forward(float* u, const float* bias, float* act, int64_t rows, int64_t F) {
  using Fv = typename V::F;
  const Fv half = V::set1(0.5f), one = V::set1(1.0f), inv_sqrt2 = V::set1(0.70710678118654752f);
  parallel_for(rows, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* ur = u + r * F;
      float* ar = act + r * F;
      for_vectors<V>(F, [&](int64_t i, int64_t n) GALE_ALWAYS_INLINE {
        Fv x = ld<V>(ur + i, n);
        if (bias) {
          x = V::add(x, ld<V>(bias + i, n));
          st<V>(ur + i, x, n);
        }
        st<V>(ar + i, V::mul(V::mul(half, x), V::add(one, simd::erf<V>(V::mul(x, inv_sqrt2)))), n);
      });
    }
  });
}

template <class V>
void gelu_backward(const float* dact, const float* u, float* du, float* dbias, int64_t rows, int64_t F) {
  using Fv = typename V::F;
  const Fv half = V::set1(0.5f), one = V::set1(1.0f), inv_sqrt2 = V::set1(0.70710678118654752f);
  const Fv inv_sqrt2pi = V::set1(0.39894228040143268f), minus_half = V::set1(-0.5f);
  float* outs[1] = {dbias};
  rows_with_column_sums<V>(rows, F, 1, outs, [&](int64_t r, float* acc) {
    const float* ur = u + r * F;
    const float* dr = dact + r * F;
    float* gr = du + r * F;
    for_vectors<V>(F, [&](int64_t i, int64_t n) GALE_ALWAYS_INLINE {
      const Fv v = ld<V>(ur + i, n);
      const Fv cdf = V::mul(half, V::add(one, simd::erf<V>(V::mul(v, inv_sqrt2))));
      const Fv pdf = V::mul(inv_sqrt2pi, simd::exp<V>(V::mul(V::mul(minus_half, v), v)));
      const Fv g = V::mul(ld<V>(dr + i, n), V::fmadd(v, pdf, cdf));
      st<V>(gr + i, g, n);
      if (acc) st<V>(acc + i, V::add(ld<V>(acc + i, n), g), n);
    });
  });
}

// u is [rows, 2F] (gate then up): act = silu(g)·p (gated_unit_forward in fused_common_impl.h).
template <class V>
void swiglu_forward(float* u, const float* bias, float* act, int64_t rows, int64_t F) {
  using Fv = typename V::F;
  gated_unit_forward<V>(u, bias, act, rows, F, [](Fv g, Fv p) GALE_ALWAYS_INLINE {
    return V::mul(V::mul(g, simd::sigmoid<V>(g)), p);
  });
}

template <class V>
void swiglu_backward(const float* dact, const float* u, float* du, float* dbias, int64_t rows, int64_t F) {
  using Fv = typename V::F;
  const Fv one = V::set1(1.0f);
  gated_unit_backward<V>(dact, u, du, dbias, rows, F, [&](Fv g, Fv p, Fv d, Fv* dg, Fv* dp) GALE_ALWAYS_INLINE {
    const Fv s = simd::sigmoid<V>(g);
    *dp = V::mul(d, V::mul(g, s));
    // dgate = d·up·s·(1 + g·(1 − s))
    *dg = V::mul(V::mul(V::mul(d, p), s), V::fmadd(g, V::sub(one, s), one));
  });
}

// The GluSpec activation (kernels/cpu/activation.h); u is [rows, 2F] (gate then linear half).
template <class V>
void glu_forward(const GluSpec& spec, float* u, const float* bias, float* act, int64_t rows, int64_t F) {
  using Fv = typename V::F;
  const Fv alpha = V::set1(spec.alpha), offset = V::set1(spec.linear_offset);
  const Fv hi = V::set1(spec.clamp), lo = V::set1(-spec.clamp);
  gated_unit_forward<V>(u, bias, act, rows, F, [&](Fv g, Fv p) GALE_ALWAYS_INLINE {
    const Fv a = V::min(g, hi), b = V::min(V::max(p, lo), hi);
    return V::mul(V::mul(a, simd::sigmoid<V>(V::mul(alpha, a))), V::add(b, offset));
  });
}

template <class V>
void glu_backward(const GluSpec& spec, const float* dact, const float* u, float* du, float* dbias, int64_t rows,
                  int64_t F) {
  using Fv = typename V::F;
  const Fv one = V::set1(1.0f), zero = V::set1(0.0f), alpha = V::set1(spec.alpha);
  const Fv offset = V::set1(spec.linear_offset), hi = V::set1(spec.clamp), lo = V::set1(-spec.clamp);
  gated_unit_backward<V>(dact, u, du, dbias, rows, F, [&](Fv g, Fv p, Fv d, Fv* dg, Fv* dp) GALE_ALWAYS_INLINE {
    const Fv a = V::min(g, hi), b = V::min(V::max(p, lo), hi);
    const Fv s = simd::sigmoid<V>(V::mul(alpha, a));
    // dgate = d·(b + offset)·s·(1 + α·a·(1 − s)) where g ≤ clamp; dlin = d·a·s where |p| ≤ clamp
    const Fv dgv = V::mul(V::mul(V::mul(d, V::add(b, offset)), s), V::fmadd(V::mul(alpha, a), V::sub(one, s), one));
    const Fv dpv = V::mul(d, V::mul(a, s));
    *dg = V::select(V::le(g, hi), dgv, zero);
    *dp = V::select(V::le(p, hi), V::select(V::le(lo, p), dpv, zero), zero);
  });
}

}  // namespace gale::fused
