// Fused GeGLU (templates over a simd type V): bias + gelu(gate)·linear in one pass, forward and backward,
// for both GeLU forms (exact erf, tanh approximation). Included only by the fused_geglu_<isa>.cc files.
//
// Math, as kernels/cpu/geglu.cc's reference computes it:
//   erf   gelu(a) = a·Φ(a),  Φ(a) = ½(1 + erf(a/√2)),  gelu'(a) = Φ(a) + a·φ(a),  φ(a) = e^(−a²/2)/√(2π)
//   tanh  gelu(a) = ½a(1 + tanh z),  z = √(2/π)(a + 0.044715a³)
//         evaluated as a·s with s = ½(1 + tanh z) = sigmoid(2z), from one vector exp of −2|z| (no
//         overflow, and no cancellation in 1 − tanh² = 4s(1 − s)), so
//         gelu'(a) = s + 2a·s(1 − s)·√(2/π)(1 + 3·0.044715a²). Measured against float64: slope 1.9e-7 of
//         its peak, the reference's 1 − tanh² 5.0e-7.
#pragma once

#include "kernels/cpu/fused_common_impl.h"
#include "kernels/cpu/geglu.h"

namespace gale::fused {

template <class V>
struct GeluConsts {
  using Fv = typename V::F;
  const Fv half = V::set1(0.5f), one = V::set1(1.0f), two = V::set1(2.0f), minus_half = V::set1(-0.5f);
  const Fv minus_two = V::set1(-2.0f);
  const Fv inv_sqrt2 = V::set1(0.70710678118654752f), inv_sqrt2pi = V::set1(0.39894228040143268f);
  const Fv sqrt2_over_pi = V::set1(0.79788456080286536f);
  const Fv cubic = V::set1(0.044715f), three_cubic = V::set1(3.0f * 0.044715f);
};

// gelu(a); with d, also gelu'(a) into *d.
template <class V, GegluGate G>
GALE_ALWAYS_INLINE inline typename V::F gelu_and_slope(const GeluConsts<V>& k, typename V::F a, typename V::F* d) {
  using Fv = typename V::F;
  if constexpr (G == GegluGate::kErf) {
    const Fv cdf = V::mul(k.half, V::add(k.one, simd::erf<V>(V::mul(a, k.inv_sqrt2))));
    if (d) *d = V::fmadd(a, V::mul(k.inv_sqrt2pi, simd::exp<V>(V::mul(V::mul(k.minus_half, a), a))), cdf);
    return V::mul(a, cdf);
  } else {
    const Fv a2 = V::mul(a, a);
    const Fv z = V::mul(k.sqrt2_over_pi, V::fmadd(V::mul(k.cubic, a2), a, a));  // √(2/π)(a + c·a³)
    // e = e^(−2|z|) ≤ 1 (never overflows), r = 1/(1 + e): s = r for z ≥ 0, e·r for z < 0, and
    // s(1 − s) = e·r² without the cancellation of 1 − s (or of the reference's 1 − tanh²).
    const Fv e = simd::exp<V>(V::mul(k.minus_two, V::abs(z)));
    const Fv r = V::div(k.one, V::add(k.one, e));
    const Fv er = V::mul(e, r);
    const Fv s = V::select(V::lt(z, V::zero()), er, r);  // ½(1 + tanh z)
    if (d) {
      const Fv dz = V::mul(k.sqrt2_over_pi, V::fmadd(k.three_cubic, a2, k.one));  // z'(a)
      *d = V::fmadd(V::mul(V::mul(k.two, a), V::mul(er, r)), dz, s);            // s + 2a·s(1 − s)·z'
    }
    return V::mul(a, s);
  }
}

// u is [rows, 2F] (gate a = u[:, :F], linear half b = u[:, F:]); the bias [2F] is added to u in place
// (gated_unit_forward in fused_common_impl.h).
template <class V, GegluGate G>
void geglu_forward_gate(float* u, const float* bias, float* act, int64_t rows, int64_t F) {
  using Fv = typename V::F;
  const GeluConsts<V> k;
  gated_unit_forward<V>(u, bias, act, rows, F, [&](Fv a, Fv b) GALE_ALWAYS_INLINE {
    return V::mul(gelu_and_slope<V, G>(k, a, nullptr), b);
  });
}

// du_a = dact·b·gelu'(a), du_b = dact·gelu(a); dbias (optional) += column sums of du over fixed row chunks.
template <class V, GegluGate G>
void geglu_backward_gate(const float* dact, const float* u, float* du, float* dbias, int64_t rows, int64_t F) {
  using Fv = typename V::F;
  const GeluConsts<V> k;
  gated_unit_backward<V>(dact, u, du, dbias, rows, F, [&](Fv a, Fv b, Fv d, Fv* da, Fv* db) GALE_ALWAYS_INLINE {
    Fv slope;
    const Fv g = gelu_and_slope<V, G>(k, a, &slope);
    *da = V::mul(V::mul(d, b), slope);
    *db = V::mul(d, g);
  });
}

template <class V>
void geglu_forward(GegluGate gate, float* u, const float* bias, float* act, int64_t rows, int64_t F) {
  if (gate == GegluGate::kTanh)
    geglu_forward_gate<V, GegluGate::kTanh>(u, bias, act, rows, F);
  else
    geglu_forward_gate<V, GegluGate::kErf>(u, bias, act, rows, F);
}

template <class V>
void geglu_backward(GegluGate gate, const float* dact, const float* u, float* du, float* dbias, int64_t rows,
                    int64_t F) {
  if (gate == GegluGate::kTanh)
    geglu_backward_gate<V, GegluGate::kTanh>(dact, u, du, dbias, rows, F);
  else
    geglu_backward_gate<V, GegluGate::kErf>(dact, u, du, dbias, rows, F);
}

}  // namespace gale::fused
