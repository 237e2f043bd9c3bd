// The fused AdamW over FP8- or HiF8-coded moments (--quant-states), as one template over a simd type V:
// instantiated by quant_states_{scalar,avx2,avx512}.cc, bit-identical to adamw_step_quantised_ref.
//
// Per block: one vector pass decodes both moments (a gather from the 256-entry decode table),
// updates parameters and moments with adamw_step_ref's operations in its order (no contraction),
// keeps the new moments (kMx: their k-scaled bf16 squares) in a local buffer and their largest
// magnitude; a second pass over the buffer encodes them with the block's new scale. Every step is
// an exactly rounded IEEE operation or integer bit manipulation, element by element, so every ISA
// gives the reference's bits. Each ISA file specialises QuantIo<V> (bit casts, byte loads/stores).
// Included only by the per-ISA instantiation files (the rule in kernels/cpu/isa.h).
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/cpu/fp8_codec.h"
#include "kernels/cpu/fused_common_impl.h"
#include "kernels/cpu/quant_states.h"

namespace gale::quantvec {

// Per ISA: static I bits(F); static F floats(I); static I load_u8(const uint8_t*, int64_t n)
// (n ≤ W bytes zero-extended to lanes, the others 0); static void store_u8(uint8_t*, I, int64_t n)
// (the low byte of the first n lanes).
template <class V>
struct QuantIo;

// fp8_encode (quant_states.cc) lane by lane: round to nearest even with subnormals, saturate at
// ±max, NaN → 0.
template <class V>
GALE_ALWAYS_INLINE inline typename V::I encode(typename V::F x, const fp8::Spec& s) {
  using IO = QuantIo<V>;
  using I = typename V::I;
  const I u = IO::bits(x);
  const I sign = V::iand(V::template srli<24>(u), V::iset1(0x80u));
  const I ab = V::iand(u, V::iset1(0x7FFFFFFFu));
  const typename V::F a = IO::floats(ab);
  // Subnormal grid: a · 2^(bias − 1 + mant) < 2^mant is exact; adding 2^23 rounds it to an integer
  // (nearest even, as nearbyint), which is then the low bits of the sum.
  const I sub = V::iadd(IO::bits(V::add(V::mul(a, V::set1(s.sub_scale)), V::set1(8388608.0f))),
                        V::iset1(0u - 0x4B000000u));
  const uint32_t shift = static_cast<uint32_t>(23 - s.mant);
  const I odd = V::iand(V::srlv(ab, V::iset1(shift)), V::iset1(1u));
  I r = V::srlv(V::iadd(V::iadd(ab, V::iset1((1u << (shift - 1)) - 1u)), odd), V::iset1(shift));
  r = V::iadd(r, V::iset1(0u - (static_cast<uint32_t>(127 - s.bias) << s.mant)));
  const I max_code = V::iset1(s.max_code);
  r = V::iselect(V::igt(r, max_code), max_code, r);
  I mag = V::iselect(V::lt(a, V::set1(s.min_normal)), sub, r);
  mag = V::iselect(V::ge(a, V::set1(s.max)), max_code, mag);
  const I code = V::ior(sign, mag);
  return V::iselect(V::iult(V::iset1(0x7F800000u), ab), V::iset1(0u), code);
}

// hif8_encode (quant_states.cc) lane by lane, with selects instead of its branches: round half away
// from zero on the binade's mantissa width (add half a unit, cut), the code assembled for the rounded
// exponent's dot field, then denormals, saturation at ±32768, zero, ±Inf and NaN.
template <class V>
GALE_ALWAYS_INLINE inline typename V::I encode_hif8(typename V::F x) {
  using IO = QuantIo<V>;
  using I = typename V::I;
  const I ones = V::iset1(0xFFFFFFFFu);
  const I u = IO::bits(x);
  const I sign = V::iand(V::template srli<24>(u), V::iset1(0x80u));
  const I a = V::iand(u, V::iset1(0x7FFFFFFFu));
  // |e| of a biased exponent b: b − 127 or 127 − b (= ~b + 128).
  auto abs_exp = [&](I b) GALE_ALWAYS_INLINE {
    return V::iselect(V::igt(b, V::iset1(126u)), V::iadd(b, V::iset1(0u - 127u)), V::iadd(V::ixor(b, ones), V::iset1(128u)));
  };
  // 23 − mantissa bits: 20 for |e| ≤ 3, 21 to 7, 22 to 15, 23 beyond.
  auto cut_of = [&](I ae) GALE_ALWAYS_INLINE {
    I c = V::iset1(20u);
    c = V::iselect(V::igt(ae, V::iset1(3u)), V::iset1(21u), c);
    c = V::iselect(V::igt(ae, V::iset1(7u)), V::iset1(22u), c);
    return V::iselect(V::igt(ae, V::iset1(15u)), V::iset1(23u), c);
  };
  const I biased = V::template srli<23>(a);
  const I cut = cut_of(abs_exp(biased));
  const I half = V::srlv(V::iset1(1u << 22), V::iadd(V::ixor(cut, ones), V::iset1(24u)));  // 2^(cut − 1)
  const I below = V::iadd(V::iadd(half, half), ones);                                      // 2^cut − 1
  const I r = V::iand(V::iadd(a, half), V::ixor(below, ones));
  const I b2 = V::template srli<23>(r);
  const I ae2 = abs_exp(b2);
  const I mant = V::srlv(V::iand(r, V::iset1(0x7FFFFFu)), cut_of(ae2));
  const I neg = V::iselect(V::igt(b2, V::iset1(126u)), V::iset1(0u), V::iset1(0x10u));  // exponent sign, bit 4
  const I d4 = V::ior(V::ior(V::iset1(0x60u), neg), V::ior(V::template slli<1>(V::iadd(ae2, V::iset1(0u - 8u))), mant));
  const I d3 = V::ior(V::ior(V::iset1(0x40u), neg), V::ior(V::template slli<2>(V::iadd(ae2, V::iset1(0u - 4u))), mant));
  const I d2 = V::ior(V::ior(V::iset1(0x20u), neg), V::ior(V::template slli<3>(V::iadd(ae2, V::iset1(0u - 2u))), mant));
  const I d1 = V::ior(V::ior(V::iset1(0x10u), V::template srli<1>(neg)), mant);
  const I d0 = V::ior(V::iset1(0x08u), mant);
  I code = d4;
  code = V::iselect(V::igt(V::iset1(8u), ae2), d3, code);
  code = V::iselect(V::igt(V::iset1(4u), ae2), d2, code);
  code = V::iselect(V::igt(V::iset1(2u), ae2), d1, code);
  code = V::iselect(V::ieq(ae2, V::iset1(0u)), d0, code);
  // Denormals: rounded exponent ≤ −16 (b2 ≤ 111) → 2^(m − 23) with m = b2 − 104, at least 1.
  const I denormal = V::iselect(V::igt(b2, V::iset1(104u)), V::iadd(b2, V::iset1(0u - 104u)), V::iset1(1u));
  code = V::iselect(V::igt(V::iset1(112u), b2), denormal, code);
  code = V::iselect(V::igt(r, V::iset1(0x473FFFFFu)), V::iset1(0x6Eu), code);  // ≥ 1.5 · 2^15: saturate
  code = V::ior(sign, code);
  code = V::iselect(V::igt(V::iset1(104u), biased), V::iset1(0u), code);  // |x| < 2^−23: zero
  code = V::iselect(V::ieq(a, V::iset1(0x7F800000u)), V::ior(sign, V::iset1(0x6Fu)), code);
  return V::iselect(V::iult(V::iset1(0x7F800000u), a), V::iset1(0x80u), code);
}

template <class V>
GALE_ALWAYS_INLINE inline typename V::F negate(typename V::F x) {
  using IO = QuantIo<V>;
  return IO::floats(V::ixor(IO::bits(x), V::iset1(0x80000000u)));
}

// round_to_bf16(signed_square(x)): MindSpeed's k-scaling (x ≥ 0 ? x² : −x², NaN negated), then bf16
// round to nearest even with NaN passed through.
template <class V>
GALE_ALWAYS_INLINE inline typename V::F k_scale(typename V::F x) {
  using IO = QuantIo<V>;
  using I = typename V::I;
  const typename V::F sq = V::mul(x, x);
  const I u = IO::bits(V::select(V::ge(x, V::zero()), sq, negate<V>(sq)));
  const I lsb = V::iand(V::template srli<16>(u), V::iset1(1u));
  const I rounded = V::iand(V::iadd(V::iadd(u, V::iset1(0x7FFFu)), lsb), V::iset1(0xFFFF0000u));
  const I nan = V::iand(u, V::iset1(0x7FFFFFFFu));
  return IO::floats(V::iselect(V::iult(V::iset1(0x7F800000u), nan), u, rounded));
}

// signed_sqrt(y): y ≥ 0 ? sqrt(y) : −sqrt(−y) (so −0 stays −0 and NaN is negated twice).
template <class V>
GALE_ALWAYS_INLINE inline typename V::F signed_sqrt(typename V::F y) {
  const typename V::M nonneg = V::ge(y, V::zero());
  const typename V::F r = V::sqrt(V::select(nonneg, y, negate<V>(y)));
  return V::select(nonneg, r, negate<V>(r));
}

// One moment's block: how to decode it (table and scale) and where its codes and scale live.
struct BlockState {
  const float* table;  // fp8_decode of each code
  const fp8::Spec* spec;  // FP8 codes; nullptr for HiF8
  float target;  // HiF8: the scale target T
  uint8_t* codes;  // of the block
  uint8_t* scales;  // of the piece
  float scale;  // decode multiplier: 1 / linear scale, or 2^X
};

template <class V>
GALE_ALWAYS_INLINE inline typename V::F decode(const BlockState& b, int64_t i, int64_t k, bool mx) {
  const typename V::F y = V::mul(V::gather_n(b.table, QuantIo<V>::load_u8(b.codes + i, k), k), V::set1(b.scale));
  return mx ? signed_sqrt<V>(y) : y;
}

// Encodes buf[0, len) (kMx: already k-scaled) with the block's new scale from `amax`.
template <class V>
GALE_ALWAYS_INLINE inline void encode_block(const float* buf, int64_t len, float amax, bool mx, int64_t b,
                                            BlockState& st) {
  float mul;
  if (mx) {
    const int exponent = fp8::e8m0_exponent(amax, st.spec->emax);
    mul = fp8::pow2(-exponent);
    st.scales[b] = static_cast<uint8_t>(exponent + 127);
  } else {
    mul = st.spec ? fp8::linear_scale(amax, st.spec->max) : fp8::hif8_scale(amax, st.target);
    std::memcpy(st.scales + 4 * b, &mul, sizeof mul);
  }
  const typename V::F vm = V::set1(mul);
  if (!st.spec) {
    fused::for_vectors<V>(len, [&](int64_t i, int64_t k) GALE_ALWAYS_INLINE {
      QuantIo<V>::store_u8(st.codes + i, encode_hif8<V>(V::mul(fused::ld<V>(buf + i, k), vm)), k);
    });
    return;
  }
  fused::for_vectors<V>(len, [&](int64_t i, int64_t k) GALE_ALWAYS_INLINE {
    QuantIo<V>::store_u8(st.codes + i, encode<V>(V::mul(fused::ld<V>(buf + i, k), vm), *st.spec), k);
  });
}

// The FP8 spec of a format, nullptr for HiF8.
inline const fp8::Spec* spec_of(Fp8Format f) {
  return f == Fp8Format::kE4M3 ? &fp8::kE4M3 : f == Fp8Format::kE5M2 ? &fp8::kE5M2 : nullptr;
}

template <class V>
void adamw_step_quantised(float* p, const float* g, QuantStateRef m, QuantStateRef v, int64_t n,
                          const QuantLayout& l, const AdamWHyper& h, const float* m_table, const float* v_table) {
  using F = typename V::F;
  const bool mx = l.mode == QuantMode::kMx;
  const fp8::Spec* ms = spec_of(m.format);
  const fp8::Spec* vs = spec_of(v.format);
  const float bc1 = 1.0f - __builtin_powf(h.beta1, static_cast<float>(h.step));
  const float bc2 = 1.0f - __builtin_powf(h.beta2, static_cast<float>(h.step));
  const F b1 = V::set1(h.beta1), b2 = V::set1(h.beta2), c1 = V::set1(1.0f - h.beta1), c2 = V::set1(1.0f - h.beta2);
  const F vbc1 = V::set1(bc1), vbc2 = V::set1(bc2), eps = V::set1(h.eps), wd = V::set1(h.weight_decay);
  const F lr = V::set1(h.lr), grad_scale = V::set1(h.grad_scale);
  const int64_t blocks = quant_num_blocks(n, l);
  const int64_t longest = n < l.block ? n : l.block;
  const int64_t grain = fused::max_i64(1, (int64_t{1} << 14) / fused::max_i64(1, longest));
  parallel_for(blocks, grain, [&](int64_t b0, int64_t b1_) {
    ScratchBuffer scratch(sizeof(float) * static_cast<size_t>(2 * longest));
    float* mb = scratch.floats();
    float* vb = mb + longest;
    for (int64_t b = b0; b < b1_; ++b) {
      const int64_t lo = b == 0 ? 0 : l.first + (b - 1) * l.block;
      const int64_t len = fused::min_i64(n, l.first + b * l.block) - lo;
      BlockState sm{m_table, ms, m.target, m.codes + lo, m.scales, 0.0f};
      BlockState sv{v_table, vs, v.target, v.codes + lo, v.scales, 0.0f};
      if (mx) {
        sm.scale = fp8::pow2(static_cast<int>(m.scales[b]) - 127);
        sv.scale = fp8::pow2(static_cast<int>(v.scales[b]) - 127);
      } else {
        float s;
        std::memcpy(&s, m.scales + 4 * b, sizeof s);
        sm.scale = 1.0f / s;
        std::memcpy(&s, v.scales + 4 * b, sizeof s);
        sv.scale = 1.0f / s;
      }
      float* pb = p + lo;
      const float* gb = g + lo;
      F m_amax = V::zero(), v_amax = V::zero();
      fused::for_vectors<V>(len, [&](int64_t i, int64_t k) GALE_ALWAYS_INLINE {
        const F gv = V::mul(fused::ld<V>(gb + i, k), grad_scale), pv = fused::ld<V>(pb + i, k);
        const F mv = V::add(V::mul(b1, decode<V>(sm, i, k, mx)), V::mul(c1, gv));
        const F vv = V::add(V::mul(b2, decode<V>(sv, i, k, mx)), V::mul(V::mul(c2, gv), gv));
        const F denom = V::add(V::sqrt(V::div(vv, vbc2)), eps);
        const F update = V::add(V::div(V::div(mv, vbc1), denom), V::mul(wd, pv));
        fused::st<V>(pb + i, V::sub(pv, V::mul(lr, update)), k);
        const F mq = mx ? k_scale<V>(mv) : mv, vq = mx ? k_scale<V>(vv) : vv;
        fused::st<V>(mb + i, mq, k);
        fused::st<V>(vb + i, vq, k);
        // max(new, acc): a NaN lane keeps acc, as std::max(amax, |x|) in the reference.
        m_amax = V::max(V::abs(mq), m_amax);
        v_amax = V::max(V::abs(vq), v_amax);
      });
      encode_block<V>(mb, len, V::reduce_max(m_amax), mx, b, sm);
      encode_block<V>(vb, len, V::reduce_max(v_amax), mx, b, sv);
    }
  });
}

// quantise_state_ref, vectorised: per block the largest magnitude (kMx: of the k-scaled values,
// kept in a local buffer), then the codes with the new scale.
template <class V>
void quantise_state(const float* x, int64_t n, const QuantLayout& l, QuantStateRef out) {
  using F = typename V::F;
  const bool mx = l.mode == QuantMode::kMx;
  const fp8::Spec* spec = spec_of(out.format);
  const int64_t blocks = quant_num_blocks(n, l);
  const int64_t longest = n < l.block ? n : l.block;
  const int64_t grain = fused::max_i64(1, (int64_t{1} << 14) / fused::max_i64(1, longest));
  parallel_for(blocks, grain, [&](int64_t b0, int64_t b1) {
    ScratchBuffer scratch(sizeof(float) * static_cast<size_t>(mx ? longest : 1));
    float* buf = scratch.floats();
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t lo = b == 0 ? 0 : l.first + (b - 1) * l.block;
      const int64_t len = fused::min_i64(n, l.first + b * l.block) - lo;
      BlockState st{nullptr, spec, out.target, out.codes + lo, out.scales, 0.0f};
      F amax = V::zero();
      fused::for_vectors<V>(len, [&](int64_t i, int64_t k) GALE_ALWAYS_INLINE {
        F y = fused::ld<V>(x + lo + i, k);
        if (mx) {
          y = k_scale<V>(y);
          fused::st<V>(buf + i, y, k);
        }
        amax = V::max(V::abs(y), amax);
      });
      encode_block<V>(mx ? buf : x + lo, len, V::reduce_max(amax), mx, b, st);
    }
  });
}

// dequantise_state_ref, vectorised.
template <class V>
void dequantise_state(QuantStateRef in, int64_t n, const QuantLayout& l, float* x, const float* table) {
  const bool mx = l.mode == QuantMode::kMx;
  const int64_t blocks = quant_num_blocks(n, l);
  const int64_t longest = n < l.block ? n : l.block;
  const int64_t grain = fused::max_i64(1, (int64_t{1} << 14) / fused::max_i64(1, longest));
  parallel_for(blocks, grain, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t lo = b == 0 ? 0 : l.first + (b - 1) * l.block;
      const int64_t len = fused::min_i64(n, l.first + b * l.block) - lo;
      BlockState st{table, nullptr, 0.0f, in.codes + lo, in.scales, 0.0f};
      if (mx) {
        st.scale = fp8::pow2(static_cast<int>(in.scales[b]) - 127);
      } else {
        float s;
        std::memcpy(&s, in.scales + 4 * b, sizeof s);
        st.scale = 1.0f / s;
      }
      fused::for_vectors<V>(len, [&](int64_t i, int64_t k) GALE_ALWAYS_INLINE {
        fused::st<V>(x + lo + i, decode<V>(st, i, k, mx), k);
      });
    }
  });
}

}  // namespace gale::quantvec
