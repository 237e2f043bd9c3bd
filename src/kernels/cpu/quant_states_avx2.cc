// AVX2 build of the fused AdamW over FP8-coded moments and the quantiser/dequantiser (quant_states_impl.h).
// No implicit a·b + c -> fma contraction: the kernel keeps the reference's separate roundings.
#pragma GCC optimize("fp-contract=off")
#include "kernels/cpu/simd_avx2.h"
#include "kernels/cpu/quant_states_impl.h"

namespace gale {

namespace quantvec {
template <>
struct QuantIo<simd::Avx2> {
  static __m256i bits(__m256 x) { return _mm256_castps_si256(x); }
  static __m256 floats(__m256i x) { return _mm256_castsi256_ps(x); }
  static __m256i load_u8(const uint8_t* p, int64_t n) {
    __m128i b;
    if (n >= 8) {
      b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    } else {
      uint64_t w = 0;
      std::memcpy(&w, p, static_cast<size_t>(n > 0 ? n : 0));
      b = _mm_cvtsi64_si128(static_cast<long long>(w));
    }
    return _mm256_cvtepu8_epi32(b);
  }
  static void store_u8(uint8_t* p, __m256i v, int64_t n) {
    // The low byte of each 32-bit lane to bytes 0-3 of each 128-bit half, then the halves joined.
    const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,  //
                                          0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i s = _mm256_shuffle_epi8(v, pick);
    const __m128i joined = _mm_unpacklo_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    if (n >= 8) {
      _mm_storel_epi64(reinterpret_cast<__m128i*>(p), joined);
    } else if (n > 0) {
      const uint64_t w = static_cast<uint64_t>(_mm_cvtsi128_si64(joined));
      std::memcpy(p, &w, static_cast<size_t>(n));
    }
  }
};
}  // namespace quantvec

void adamw_step_quantised_avx2(float* p, const float* g, QuantStateRef m, QuantStateRef v, int64_t n,
                               const QuantLayout& layout, const AdamWHyper& h) {
  quantvec::adamw_step_quantised<simd::Avx2>(p, g, m, v, n, layout, h, fp8_decode_table(m.format),
                                             fp8_decode_table(v.format));
}

void quantise_state_avx2(const float* x, int64_t n, const QuantLayout& layout, QuantStateRef out) {
  quantvec::quantise_state<simd::Avx2>(x, n, layout, out);
}

void dequantise_state_avx2(QuantStateRef in, int64_t n, const QuantLayout& layout, float* x) {
  quantvec::dequantise_state<simd::Avx2>(in, n, layout, x, fp8_decode_table(in.format));
}

}  // namespace gale
