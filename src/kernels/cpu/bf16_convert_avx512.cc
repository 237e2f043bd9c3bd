// AVX-512 f32 <-> bf16 conversion, bit-identical to core/dtype.h (round to nearest even, NaN quiet).
#include <immintrin.h>

#include "kernels/cpu/bf16_convert.h"

// GCC 12's AVX-512 intrinsics trip -W(maybe-)uninitialized (GCC bug 105593), see simd_avx512.h.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace gale {

namespace {
// 16 floats -> 16 bf16 bit patterns in the low halves of 32-bit lanes.
inline __m512i round_to_bf16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __m512i quiet_nan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x0040));
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_blend_epi32(nan, rounded, quiet_nan);
}
}  // namespace

void convert_f32_to_bf16_avx512(const float* x, bf16* y, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), _mm512_cvtepi32_epi16(round_to_bf16(_mm512_loadu_ps(x + i))));
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1u);
    _mm256_mask_storeu_epi16(y + i, m, _mm512_cvtepi32_epi16(round_to_bf16(_mm512_maskz_loadu_ps(m, x + i))));
  }
}

void convert_bf16_to_f32_avx512(const bf16* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
    _mm512_storeu_ps(y + i, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
  }
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1u);
    const __m256i h = _mm256_maskz_loadu_epi16(m, x + i);
    _mm512_mask_storeu_ps(y + i, m, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
  }
}

}  // namespace gale
