// AVX2 + FMA vector type for the ISA-generic kernels: include only from *_avx2.cc files.
// Same interface as simd_avx512.h; masks are float lanes of all ones / all zeros.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace gale::simd {

struct Avx2 {
  using F = __m256;
  using I = __m256i;
  using M = __m256;
  static constexpr int W = 8;
  static constexpr int kRegisters = 16;

  // ---- float lanes ----
  static F zero() { return _mm256_setzero_ps(); }
  static F set1(float x) { return _mm256_set1_ps(x); }
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static I first_i(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(n < W ? (n < 0 ? 0 : n) : W)), iota());
  }
  static M first(int64_t n) { return _mm256_castsi256_ps(first_i(n)); }
  static F load_n(const float* p, int64_t n, float fill = 0.0f) {
    const I m = first_i(n);
    return _mm256_blendv_ps(set1(fill), _mm256_maskload_ps(p, m), _mm256_castsi256_ps(m));
  }
  static void store_n(float* p, F v, int64_t n) { _mm256_maskstore_ps(p, first_i(n), v); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F div(F a, F b) { return _mm256_div_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F fnmadd(F a, F b, F c) { return _mm256_fnmadd_ps(a, b, c); }
  static F max(F a, F b) { return _mm256_max_ps(a, b); }
  static F min(F a, F b) { return _mm256_min_ps(a, b); }
  static F sqrt(F a) { return _mm256_sqrt_ps(a); }
  static F abs(F a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
  static F round(F a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static F copysign(F magnitude, F sign) {
    const F sign_bit = _mm256_set1_ps(-0.0f);
    return _mm256_or_ps(_mm256_and_ps(sign_bit, sign), _mm256_andnot_ps(sign_bit, magnitude));
  }
  // p·2^n for integral n in [-252, 254], as two factors that are each a normal float.
  static F ldexp(F p, F n) {
    const I ni = _mm256_cvtps_epi32(n);
    const I n1 = _mm256_srai_epi32(ni, 1);
    const I n2 = _mm256_sub_epi32(ni, n1);
    const I bias = _mm256_set1_epi32(127);
    const F f1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
    const F f2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, f1), f2);
  }
  static float reduce_add(F a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
  }
  static float reduce_max(F a) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
  }

  // ---- masks ----
  static M lt(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
  static M le(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_LE_OQ); }
  static M gt(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_GT_OQ); }
  static M ge(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_GE_OQ); }
  static M eq(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_EQ_OQ); }
  static M is_nan(F a) { return _mm256_cmp_ps(a, a, _CMP_UNORD_Q); }
  static M mask_and(M a, M b) { return _mm256_and_ps(a, b); }
  static M mask_or(M a, M b) { return _mm256_or_ps(a, b); }
  static M mask_andnot(M a, M b) { return _mm256_andnot_ps(a, b); }
  static bool any(M m) { return _mm256_movemask_ps(m) != 0; }
  static F select(M m, F if_true, F if_false) { return _mm256_blendv_ps(if_false, if_true, m); }
  static uint32_t mask_bits(M m) { return static_cast<uint32_t>(_mm256_movemask_ps(m)); }
  static M mask_from_bits(uint32_t bits) {
    const I bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    const I lanes = _mm256_and_si256(_mm256_set1_epi32(static_cast<int32_t>(bits)), bit);
    return _mm256_castsi256_ps(_mm256_cmpeq_epi32(lanes, bit));
  }

  // ---- 32-bit integer lanes ----
  static I iset1(uint32_t x) { return _mm256_set1_epi32(static_cast<int32_t>(x)); }
  static I iload(const int32_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static I iload_n(const int32_t* p, int64_t n) { return _mm256_maskload_epi32(p, first_i(n)); }
  static I iota() { return _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7); }
  static I iadd(I a, I b) { return _mm256_add_epi32(a, b); }
  static I ixor(I a, I b) { return _mm256_xor_si256(a, b); }
  static I iand(I a, I b) { return _mm256_and_si256(a, b); }
  static I ior(I a, I b) { return _mm256_or_si256(a, b); }
  template <int kBits>
  static I srli(I a) {
    return _mm256_srli_epi32(a, kBits);
  }
  template <int kBits>
  static I slli(I a) {
    return _mm256_slli_epi32(a, kBits);
  }
  static I srlv(I a, I bits) { return _mm256_srlv_epi32(a, bits); }
  static M igt(I a, I b) { return _mm256_castsi256_ps(_mm256_cmpgt_epi32(a, b)); }
  static M ieq(I a, I b) { return _mm256_castsi256_ps(_mm256_cmpeq_epi32(a, b)); }
  static M iult(I a, I b) {
    const I flip = _mm256_set1_epi32(static_cast<int32_t>(0x80000000u));
    return igt(_mm256_xor_si256(b, flip), _mm256_xor_si256(a, flip));
  }
  static I iselect(M m, I if_true, I if_false) {
    return _mm256_blendv_epi8(if_false, if_true, _mm256_castps_si256(m));
  }
  static F to_float(I a) { return _mm256_cvtepi32_ps(a); }
  static I imul(I a, I b) { return _mm256_mullo_epi32(a, b); }
  static F gather_n(const float* base, I idx, int64_t n) {
    return _mm256_mask_i32gather_ps(zero(), base, idx, first(n), 4);
  }
  static void mulhilo(I a, I b, I* hi, I* lo) {
    const I even = _mm256_mul_epu32(a, b);
    const I odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), _mm256_srli_epi64(b, 32));
    *lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
    *hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
  }
};

}  // namespace gale::simd
