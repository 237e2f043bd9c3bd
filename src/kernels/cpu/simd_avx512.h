// AVX-512 vector type for the ISA-generic kernels: include only from *_avx512.cc files.
//
// Every ISA type (simd_avx2.h, simd_scalar.h) offers the same static functions, so one template
// (simd_math.h, fused_*_impl.h) compiles for each; W is the number of float lanes.
#pragma once

#include <immintrin.h>

#include <cstdint>

// GCC 12's AVX-512 intrinsics (e.g. the _mm512_reduce_* and masked-load families) start from
// _mm512_undefined_*, which -W(maybe-)uninitialized reports in every file that uses them (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace gale::simd {

struct Avx512 {
  using F = __m512;
  using I = __m512i;
  using M = __mmask16;
  static constexpr int W = 16;
  static constexpr int kRegisters = 32;

  // ---- float lanes ----
  static F zero() { return _mm512_setzero_ps(); }
  static F set1(float x) { return _mm512_set1_ps(x); }
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static M first(int64_t n) {
    return n >= W ? static_cast<M>(0xFFFF) : n <= 0 ? static_cast<M>(0) : static_cast<M>((1u << n) - 1u);
  }
  // The first n lanes from p, the others `fill`.
  static F load_n(const float* p, int64_t n, float fill = 0.0f) {
    return _mm512_mask_loadu_ps(set1(fill), first(n), p);
  }
  static void store_n(float* p, F v, int64_t n) { _mm512_mask_storeu_ps(p, first(n), v); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F div(F a, F b) { return _mm512_div_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }    // a·b + c
  static F fnmadd(F a, F b, F c) { return _mm512_fnmadd_ps(a, b, c); }  // c − a·b
  // max/min return b when either is NaN: pass the value that must propagate NaN as b.
  static F max(F a, F b) { return _mm512_max_ps(a, b); }
  static F min(F a, F b) { return _mm512_min_ps(a, b); }
  static F sqrt(F a) { return _mm512_sqrt_ps(a); }
  static F abs(F a) { return _mm512_abs_ps(a); }
  static F round(F a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static F copysign(F magnitude, F sign) {
    const I sign_bit = _mm512_set1_epi32(static_cast<int32_t>(0x80000000u));
    // bitwise sign_bit ? sign : magnitude
    return _mm512_castsi512_ps(_mm512_ternarylogic_epi32(sign_bit, _mm512_castps_si512(sign),
                                                         _mm512_castps_si512(magnitude), 0xCA));
  }
  // p·2^n for integral n in [-252, 254] (handles overflow to inf and subnormal results).
  static F ldexp(F p, F n) { return _mm512_scalef_ps(p, n); }
  static float reduce_add(F a) { return _mm512_reduce_add_ps(a); }
  static float reduce_max(F a) { return _mm512_reduce_max_ps(a); }

  // ---- masks ----
  static M lt(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
  static M le(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_LE_OQ); }
  static M gt(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
  static M ge(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_GE_OQ); }
  static M eq(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ); }
  static M is_nan(F a) { return _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q); }
  static M mask_and(M a, M b) { return static_cast<M>(a & b); }
  static M mask_or(M a, M b) { return static_cast<M>(a | b); }
  static M mask_andnot(M a, M b) { return static_cast<M>(~a & b); }  // (not a) and b
  static bool any(M m) { return m != 0; }
  static F select(M m, F if_true, F if_false) { return _mm512_mask_blend_ps(m, if_false, if_true); }
  // Lane l of the mask as bit l of an integer, and back.
  static uint32_t mask_bits(M m) { return m; }
  static M mask_from_bits(uint32_t bits) { return static_cast<M>(bits); }

  // ---- 32-bit integer lanes ----
  static I iset1(uint32_t x) { return _mm512_set1_epi32(static_cast<int32_t>(x)); }
  static I iload(const int32_t* p) { return _mm512_loadu_si512(p); }
  static I iload_n(const int32_t* p, int64_t n) { return _mm512_maskz_loadu_epi32(first(n), p); }
  static I iota() { return _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15); }
  static I iadd(I a, I b) { return _mm512_add_epi32(a, b); }
  static I ixor(I a, I b) { return _mm512_xor_si512(a, b); }
  static I iand(I a, I b) { return _mm512_and_si512(a, b); }
  static I ior(I a, I b) { return _mm512_or_si512(a, b); }
  template <int kBits>
  static I srli(I a) {
    return _mm512_srli_epi32(a, kBits);
  }
  template <int kBits>
  static I slli(I a) {
    return _mm512_slli_epi32(a, kBits);
  }
  static I srlv(I a, I bits) { return _mm512_srlv_epi32(a, bits); }  // a[l] >> bits[l] (logical)
  static M igt(I a, I b) { return _mm512_cmpgt_epi32_mask(a, b); }
  static M ieq(I a, I b) { return _mm512_cmpeq_epi32_mask(a, b); }
  static M iult(I a, I b) { return _mm512_cmplt_epu32_mask(a, b); }
  static I iselect(M m, I if_true, I if_false) { return _mm512_mask_blend_epi32(m, if_false, if_true); }
  static F to_float(I a) { return _mm512_cvtepi32_ps(a); }
  static I imul(I a, I b) { return _mm512_mullo_epi32(a, b); }
  // base[idx[l]] for the first n lanes, 0 in the others (which read nothing).
  static F gather_n(const float* base, I idx, int64_t n) {
    return _mm512_mask_i32gather_ps(zero(), first(n), idx, base, 4);
  }
  // hi/lo 32 bits of the 64-bit products a·b, lane by lane (unsigned).
  static void mulhilo(I a, I b, I* hi, I* lo) {
    const I even = _mm512_mul_epu32(a, b);
    const I odd = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), _mm512_srli_epi64(b, 32));
    *lo = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64(odd, 32));
    *hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd);
  }
};

}  // namespace gale::simd
