// Vector math on any simd type (simd_avx512.h, simd_avx2.h, simd_scalar.h): exp, erf, sigmoid, and
// Philox-4x32-10 dropout masks bit-identical to core/rng.h.
//
// Accuracy (measured by tests/kernels/simd_math_test.cc against std::exp / std::erf in double):
//   exp  Cody-Waite reduction + degree-7 Taylor polynomial: ≤ 2 ulp; +inf above 88.72, 0 below −87
//        (e^−87 ≈ 1.6e-38: no subnormal results or intermediates), NaN stays NaN.
//   erf  |x| ≤ 1: c0·x + x³·P(x²);  |x| > 1: 1 − exp(−x²)·Q(1/|x|) (coefficients fitted by
//        tools/reference/fit_erf.py): ≤ 2.5 ulp of max(|erf(x)|, 1/8) (2.02 measured), NaN stays NaN.
// The one-lane Scalar type uses std::exp / std::erf instead.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

namespace gale::simd {

template <class V, int N>
typename V::F horner(const float (&coeffs)[N], typename V::F x) {
  typename V::F p = V::set1(coeffs[0]);
  for (int i = 1; i < N; ++i) p = V::fmadd(p, x, V::set1(coeffs[i]));
  return p;
}

template <class V>
typename V::F exp(typename V::F x) {
  if constexpr (V::W == 1) {
    return std::exp(x);
  } else {
    using F = typename V::F;
    static constexpr float kTaylor[8] = {1.0f / 5040, 1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f};
    // Below −87 (e^−87 ≈ 1.6e-38, just above FLT_MIN) the result is flushed to 0, and the clamped
    // input never produces a subnormal intermediate: subnormals cost a microcode assist (~100
    // cycles) each, and masked attention scores (−inf) would hit that path constantly.
    const F hi = V::set1(88.7228394f), lo = V::set1(-87.0f);
    const F xc = V::min(hi, V::max(lo, x));  // NaN passes (x is the second operand)
    const F n = V::round(V::mul(xc, V::set1(1.44269504088896341f)));
    F r = V::fnmadd(n, V::set1(0.693145751953125f), xc);  // ln 2 split: 16-bit head (n·head exact)
    r = V::fnmadd(n, V::set1(1.428606765330187e-06f), r);
    F result = V::ldexp(horner<V>(kTaylor, r), n);
    result = V::select(V::gt(x, hi), V::set1(std::numeric_limits<float>::infinity()), result);
    return V::select(V::lt(x, lo), V::zero(), result);
  }
}

template <class V>
typename V::F erf(typename V::F x) {
  if constexpr (V::W == 1) {
    return std::erf(x);
  } else {
    using F = typename V::F;
    // From tools/reference/fit_erf.py (highest degree first).
    // erf(x) = c0·x + x³·P(x²) on |x| ≤ 1, c0 = 2/√π (the leading term gets one rounding).
    static constexpr float kErfSmall[6] = {7.933493856e-05f, -8.034846640e-04f, 5.191218376e-03f,
                                           -2.685539945e-02f, 1.128362573e-01f, -3.761262988e-01f};
    static constexpr float kErfSmallC0 = 1.128379167e+00f;
    static constexpr float kErfcLarge[9] = {-8.870569873e-03f, 2.566276960e-02f,  2.990831178e-02f,
                                            -2.492048154e-01f, 5.021969966e-01f,  -4.739520355e-01f,
                                            4.260821009e-02f,  5.589597449e-01f,  2.749467808e-04f};
    const F one = V::set1(1.0f);
    const F ax = V::abs(x);
    const F x2 = V::mul(ax, ax);
    const F small = V::fmadd(ax, V::set1(kErfSmallC0), V::mul(V::mul(ax, x2), horner<V>(kErfSmall, x2)));
    const F axc = V::min(V::set1(4.0f), V::max(one, ax));  // NaN passes
    const F q = horner<V>(kErfcLarge, V::div(one, axc));
    const F e = exp<V>(V::mul(V::set1(-1.0f), V::mul(axc, axc)));
    const F large = V::fnmadd(e, q, one);
    return V::copysign(V::select(V::le(ax, one), small, large), x);
  }
}

// 1 / (1 + exp(−x)).
template <class V>
typename V::F sigmoid(typename V::F x) {
  const typename V::F one = V::set1(1.0f);
  return V::div(one, V::add(one, exp<V>(V::sub(V::zero(), x))));
}

// Dropout masks: lane l of a draw at `index` is core/rng.h's uniform_at(seed, stream, index + l) >= p.
template <class V>
class PhiloxDropout {
 public:
  using F = typename V::F;
  using I = typename V::I;
  using M = typename V::M;

  PhiloxDropout(uint64_t seed, uint64_t stream, float p)
      : stream_lo_(static_cast<uint32_t>(stream)), stream_hi_(static_cast<uint32_t>(stream >> 32)), p_(p) {
    uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
    for (int r = 0; r < 10; ++r) {
      key0_[r] = k0;
      key1_[r] = k1;
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
  }

  float p() const { return p_; }
  float keep_scale() const { return 1.0f / (1.0f - p_); }

  // Keep mask for indices base + offsets[l] (offsets unsigned, < 2^31).
  M keep(uint64_t base, I offsets) const {
    return keep(V::iset1(static_cast<uint32_t>(base)), V::iset1(static_cast<uint32_t>(base >> 32)), offsets);
  }
  // Keep mask for the W consecutive indices base, base + 1, ...
  M keep(uint64_t base) const { return keep(base, V::iota()); }
  // Keep mask for indices (base_hi[l]:base_lo[l]) + offsets[l] (offsets unsigned, < 2^31).
  M keep(I base_lo, I base_hi, I offsets) const {
    const I lo = V::iadd(base_lo, offsets);
    const I hi = V::iadd(base_hi, V::iselect(V::iult(lo, offsets), V::iset1(1u), V::iset1(0u)));
    const I word = word0(lo, hi);
    const F u = V::mul(V::to_float(V::template srli<8>(word)), V::set1(1.0f / 16777216.0f));
    return V::ge(u, V::set1(p_));
  }

 private:
  // Word 0 of philox4x32(seed, stream, counter = hi:lo) after 10 rounds.
  I word0(I c0, I c1) const {
    const I m0 = V::iset1(0xD2511F53u), m1 = V::iset1(0xCD9E8D57u);
    I c2 = V::iset1(stream_lo_), c3 = V::iset1(stream_hi_);
    for (int r = 0; r < 10; ++r) {
      I hi0, lo0, hi1, lo1;
      V::mulhilo(m0, c0, &hi0, &lo0);
      V::mulhilo(m1, c2, &hi1, &lo1);
      const I n0 = V::ixor(V::ixor(hi1, c1), V::iset1(key0_[r]));
      const I n2 = V::ixor(V::ixor(hi0, c3), V::iset1(key1_[r]));
      c0 = n0;
      c1 = lo1;
      c2 = n2;
      c3 = lo0;
    }
    return c0;
  }

  uint32_t stream_lo_, stream_hi_;
  float p_;
  uint32_t key0_[10], key1_[10];
};

}  // namespace gale::simd
