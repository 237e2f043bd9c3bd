// AVX-512 build of the fused AdamW over FP8-coded moments and the quantiser/dequantiser (quant_states_impl.h).
// No implicit a·b + c -> fma contraction: the kernel keeps the reference's separate roundings.
#pragma GCC optimize("fp-contract=off")
#include "kernels/cpu/simd_avx512.h"
#include "kernels/cpu/quant_states_impl.h"

namespace gale {

namespace quantvec {
template <>
struct QuantIo<simd::Avx512> {
  static __m512i bits(__m512 x) { return _mm512_castps_si512(x); }
  static __m512 floats(__m512i x) { return _mm512_castsi512_ps(x); }
  static __m512i load_u8(const uint8_t* p, int64_t n) {
    return _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(simd::Avx512::first(n), p));
  }
  static void store_u8(uint8_t* p, __m512i v, int64_t n) { _mm512_mask_cvtepi32_storeu_epi8(p, simd::Avx512::first(n), v); }
};
}  // namespace quantvec

void adamw_step_quantised_avx512(float* p, const float* g, QuantStateRef m, QuantStateRef v, int64_t n,
                                 const QuantLayout& layout, const AdamWHyper& h) {
  quantvec::adamw_step_quantised<simd::Avx512>(p, g, m, v, n, layout, h, fp8_decode_table(m.format),
                                               fp8_decode_table(v.format));
}

void quantise_state_avx512(const float* x, int64_t n, const QuantLayout& layout, QuantStateRef out) {
  quantvec::quantise_state<simd::Avx512>(x, n, layout, out);
}

void dequantise_state_avx512(QuantStateRef in, int64_t n, const QuantLayout& layout, float* x) {
  quantvec::dequantise_state<simd::Avx512>(in, n, layout, x, fp8_decode_table(in.format));
}

}  // namespace gale
