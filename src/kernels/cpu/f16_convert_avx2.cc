// F16C f32 <-> f16 conversion (vcvtps2ph with round-to-nearest-even, vcvtph2ps), bit-identical to
// core/dtype.h's float_to_f16 / f16_to_float.
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/f16_convert.h"

namespace gale {

void convert_f32_to_f16_avx2(const float* x, f16* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
  if (i < n) {
    float in[8] = {0};
    f16 out[8];
    std::memcpy(in, x + i, sizeof(float) * static_cast<size_t>(n - i));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_cvtps_ph(_mm256_loadu_ps(in), _MM_FROUND_TO_NEAREST_INT));
    std::memcpy(y + i, out, sizeof(f16) * static_cast<size_t>(n - i));
  }
}

void convert_f16_to_f32_avx2(const f16* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i))));
  if (i < n) {
    f16 in[8] = {};
    float out[8];
    std::memcpy(in, x + i, sizeof(f16) * static_cast<size_t>(n - i));
    _mm256_storeu_ps(out, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in))));
    std::memcpy(y + i, out, sizeof(float) * static_cast<size_t>(n - i));
  }
}

}  // namespace gale
