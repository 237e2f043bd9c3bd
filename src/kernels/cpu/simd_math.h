// Vector math on any simd type (simd_avx512.h, simd_avx2.h, simd_scalar.h): exp, erf, sigmoid, and
// Philox-4x32-10 dropout masks bit-identical to core/rng.h's dropout_uniform_at.
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
#include <type_traits>

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

// Dropout masks, bit-identical to core/rng.h's dropout_uniform_at: index i is kept when word i & 3
// of philox4x32(seed, stream, counter = i >> 2), as the 24-bit uniform (word >> 8)·2^−24, is >= p.
// One Philox block decides 4 consecutive indices: PhiloxDropoutRow (consecutive indices, as along a
// row of bias-dropout-add) and PhiloxDropoutLanes (a per-lane base plus consecutive offsets, as
// flash attention's query lanes over key positions) use all 4 words of every block they compute.
template <class V>
class PhiloxDropout {
 public:
  using F = typename V::F;
  using I = typename V::I;
  using M = typename V::M;

  PhiloxDropout(uint64_t seed, uint64_t stream, float p)
      : stream_lo_(static_cast<uint32_t>(stream)),
        stream_hi_(static_cast<uint32_t>(stream >> 32)),
        p_(p),
        keep_above_(keep_above(p)) {
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

  // w[k] = word k of philox4x32(seed, stream, counter = (ctr_hi:ctr_lo)[l]) in lane l (10 rounds).
  void block(I ctr_lo, I ctr_hi, I (&w)[4]) const {
    const I m0 = V::iset1(0xD2511F53u), m1 = V::iset1(0xCD9E8D57u);
    I c0 = ctr_lo, c1 = ctr_hi, c2 = V::iset1(stream_lo_), c3 = V::iset1(stream_hi_);
    for (int r = 0; r < 10; ++r) {
      I hi0, lo0, hi1, lo1;
      V::mulhilo(m0, c0, &hi0, &lo0);
      V::mulhilo(m1, c2, &hi1, &lo1);
      c0 = V::ixor(V::ixor(hi1, c1), V::iset1(key0_[r]));
      c1 = lo1;
      c2 = V::ixor(V::ixor(hi0, c3), V::iset1(key1_[r]));
      c3 = lo0;
    }
    w[0] = c0;
    w[1] = c1;
    w[2] = c2;
    w[3] = c3;
  }

  // 64-bit indices as two 32-bit lanes: (hi:lo) + off, off unsigned and < 2^31.
  static void add_index(I lo, I hi, I off, I* sum_lo, I* sum_hi) {
    *sum_lo = V::iadd(lo, off);
    *sum_hi = V::iadd(hi, V::iselect(V::iult(*sum_lo, off), V::iset1(1u), V::iset1(0u)));
  }
  // The Philox counter of index (hi:lo): index >> 2 (its word is index & 3).
  static void counter_of(I lo, I hi, I* ctr_lo, I* ctr_hi) {
    *ctr_lo = V::ior(V::template srli<2>(lo), V::template slli<30>(hi));
    *ctr_hi = V::template srli<2>(hi);
  }

  // Keep decision of a Philox word: (w >> 8)·2^−24 >= p, compared as integers.
  M keep_word(I w) const { return V::igt(V::template srli<8>(w), V::iset1(keep_above_)); }

  // Per lane, bit d (d < 4) = keep decision of index 4·(ctr_hi:ctr_lo)[l] + d.
  I keep_bits(I ctr_lo, I ctr_hi) const {
    I w[4];
    block(ctr_lo, ctr_hi, w);
    I bits = V::iselect(keep_word(w[0]), V::iset1(1u), V::iset1(0u));
    for (int k = 1; k < 4; ++k) bits = V::ior(bits, V::iselect(keep_word(w[k]), V::iset1(1u << k), V::iset1(0u)));
    return bits;
  }

  // Keep mask of the indices (base_hi:base_lo)[l] + offsets[l] (offsets unsigned, < 2^31): one block
  // per lane for one index.
  M keep(I base_lo, I base_hi, I offsets) const {
    I lo, hi, ctr_lo, ctr_hi, w[4];
    add_index(base_lo, base_hi, offsets, &lo, &hi);
    counter_of(lo, hi, &ctr_lo, &ctr_hi);
    block(ctr_lo, ctr_hi, w);
    const I word = V::iand(lo, V::iset1(3u));
    const I w01 = V::iselect(V::ieq(word, V::iset1(1u)), w[1], w[0]);
    const I w23 = V::iselect(V::ieq(word, V::iset1(3u)), w[3], w[2]);
    return keep_word(V::iselect(V::igt(word, V::iset1(1u)), w23, w01));
  }

 private:
  // (w >> 8)·2^−24 >= p  ⟺  (w >> 8) > ceil(p·2^24) − 1 (p·2^24 is exact in double); −1 keeps every
  // index (p <= 0), 2^24 − 1 none (p >= 1 or NaN, as the float comparison).
  static uint32_t keep_above(float p) {
    if (!(p < 1.0f)) return (1u << 24) - 1u;
    if (!(p > 0.0f)) return ~0u;
    return static_cast<uint32_t>(__builtin_ceil(static_cast<double>(p) * 16777216.0)) - 1u;
  }

  uint32_t stream_lo_, stream_hi_;
  float p_;
  uint32_t keep_above_;
  uint32_t key0_[10], key1_[10];
};

// Keep masks of the consecutive indices start, start + 1, ..., W at a time. One Philox call covers
// 4W indices: its lanes are the W consecutive blocks from counter start >> 2, and their 4W keep
// decisions wait as bits until asked for.
template <class V>
class PhiloxDropoutRow {
 public:
  using M = typename V::M;

  PhiloxDropoutRow(const PhiloxDropout<V>& d, uint64_t start) : d_(d), counter_(start >> 2), skip_(start & 3) {}

  // Mask of the next W indices.
  M next() {
    if (avail_ < V::W) {
      bits_ |= (static_cast<Bits>(chunk()) >> skip_) << avail_;
      avail_ += 4 * V::W - skip_;
      skip_ = 0;
    }
    const M m = V::mask_from_bits(static_cast<uint32_t>(bits_) & ((1u << V::W) - 1u));
    bits_ >>= V::W;
    avail_ -= V::W;
    return m;
  }

 private:
  using I = typename V::I;
  // Pending decisions: fewer than W plus one chunk of 4W (more than 64 bits for AVX-512).
  using Bits = std::conditional_t<(5 * V::W > 64), unsigned __int128, uint64_t>;

  // Bit 4l + k = keep decision of word k of block counter_ + l, i.e. of index 4·counter_ + 4l + k.
  uint64_t chunk() {
    I lo, hi, w[4];
    const I ctr_lo = V::iset1(static_cast<uint32_t>(counter_));
    const I ctr_hi = V::iset1(static_cast<uint32_t>(counter_ >> 32));
    PhiloxDropout<V>::add_index(ctr_lo, ctr_hi, V::iota(), &lo, &hi);
    counter_ += V::W;
    d_.block(lo, hi, w);
    uint64_t bits = 0;
    for (int k = 0; k < 4; ++k) bits |= spread(V::mask_bits(d_.keep_word(w[k]))) << k;
    return bits;
  }
  // Bit l of x (l < W <= 16) moved to bit 4l.
  static uint64_t spread(uint64_t x) {
    if constexpr (V::W > 8) x = (x | x << 24) & 0x000000FF000000FFull;
    if constexpr (V::W > 4) x = (x | x << 12) & 0x000F000F000F000Full;
    if constexpr (V::W > 2) x = (x | x << 6) & 0x0303030303030303ull;
    if constexpr (V::W > 1) x = (x | x << 3) & 0x1111111111111111ull;
    return x;
  }

  const PhiloxDropout<V>& d_;
  uint64_t counter_;
  int skip_;  // decisions of the first chunk before `start`
  int avail_ = 0;
  Bits bits_ = 0;
};

// Keep masks of W lanes at the indices base[l] + offset_j, for rows j = 0, 1, 2, ... asked for in
// increasing order, base[l] = (base_hi:base_lo)[l]. With consecutive offsets (offset_j = first + j)
// each lane computes one Philox block per 4 rows and keeps its 4 decisions as bits (lanes whose
// index is not a multiple of 4 at row 0 combine two neighbouring blocks, one block ahead); with any
// other offsets, one block per lane and row.
template <class V>
class PhiloxDropoutLanes {
 public:
  using I = typename V::I;
  using M = typename V::M;

  PhiloxDropoutLanes(const PhiloxDropout<V>& d, I base_lo, I base_hi, uint32_t first, bool consecutive)
      : d_(d), base_lo_(base_lo), base_hi_(base_hi), consecutive_(consecutive) {
    if (!consecutive) return;
    I lo, hi;
    PhiloxDropout<V>::add_index(base_lo, base_hi, V::iset1(first), &lo, &hi);
    shift_ = V::iand(lo, V::iset1(3u));
    aligned_ = !V::any(V::igt(shift_, V::iset1(0u)));
    PhiloxDropout<V>::counter_of(lo, hi, &ctr_lo_, &ctr_hi_);
  }

  // Mask of row j (offset: offset_j, read only when the offsets are not consecutive).
  M keep(int64_t j, uint32_t offset) {
    if (!consecutive_) return d_.keep(base_lo_, base_hi_, V::iset1(offset));
    while (j >= end_) advance();
    const I bit = V::iset1(1u << (j & 3));
    return V::ieq(V::iand(bits_, bit), bit);
  }

 private:
  // bits_ = decisions of rows end_ .. end_ + 3; end_ += 4.
  void advance() {
    if (aligned_) {
      bits_ = d_.keep_bits(ctr_lo_, ctr_hi_);
      step();
    } else {
      if (end_ == 0) next_ = d_.keep_bits(ctr_lo_, ctr_hi_);
      const I prev = next_;
      step();
      next_ = d_.keep_bits(ctr_lo_, ctr_hi_);
      bits_ = V::iand(V::srlv(V::ior(prev, V::template slli<4>(next_)), shift_), V::iset1(15u));
    }
    end_ += 4;
  }
  void step() { PhiloxDropout<V>::add_index(ctr_lo_, ctr_hi_, V::iset1(1u), &ctr_lo_, &ctr_hi_); }

  const PhiloxDropout<V>& d_;
  I base_lo_, base_hi_;
  bool consecutive_;
  bool aligned_ = true;
  I shift_{}, ctr_lo_{}, ctr_hi_{}, bits_{}, next_{};
  int64_t end_ = 0;
};

}  // namespace gale::simd
