// AVX2 f32 <-> bf16 conversion, bit-identical to core/dtype.h (round to nearest even, NaN quiet).
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/bf16_convert.h"

namespace gale {

namespace {
// 8 floats -> 8 bf16 bit patterns packed into the low 128 bits.
inline __m128i round_to_bf16(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i quiet_nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x0040));
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  const __m256i r = _mm256_blendv_epi8(rounded, quiet_nan, nan);
  // Values fit 16 bits, so the saturating pack is exact; then gather the two lanes' low halves.
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08));
}
}  // namespace

void convert_f32_to_bf16_avx2(const float* x, bf16* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), round_to_bf16(_mm256_loadu_ps(x + i)));
  if (i < n) {
    float in[8] = {0};
    bf16 out[8];
    std::memcpy(in, x + i, sizeof(float) * static_cast<size_t>(n - i));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), round_to_bf16(_mm256_loadu_ps(in)));
    std::memcpy(y + i, out, sizeof(bf16) * static_cast<size_t>(n - i));
  }
}

void convert_bf16_to_f32_avx2(const bf16* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i));
    _mm256_storeu_ps(y + i, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
  }
  if (i < n) {
    bf16 in[8] = {};
    float out[8];
    std::memcpy(in, x + i, sizeof(bf16) * static_cast<size_t>(n - i));
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in));
    _mm256_storeu_ps(out, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
    std::memcpy(y + i, out, sizeof(float) * static_cast<size_t>(n - i));
  }
}

}  // namespace gale
