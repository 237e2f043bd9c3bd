// Baseline (one-lane) build of the fused AdamW over FP8-coded moments and the quantiser/dequantiser (quant_states_impl.h).
#pragma GCC optimize("fp-contract=off")
#include "kernels/cpu/simd_scalar.h"
#include "kernels/cpu/quant_states_impl.h"

namespace gale {

namespace quantvec {
template <>
struct QuantIo<simd::Scalar> {
  static uint32_t bits(float x) { return fp8::bits_of(x); }
  static float floats(uint32_t x) { return fp8::float_of(x); }
  static uint32_t load_u8(const uint8_t* p, int64_t n) { return n > 0 ? p[0] : 0u; }
  static void store_u8(uint8_t* p, uint32_t v, int64_t n) {
    if (n > 0) p[0] = static_cast<uint8_t>(v);
  }
};
}  // namespace quantvec

void adamw_step_quantised_scalar(float* p, const float* g, QuantStateRef m, QuantStateRef v, int64_t n,
                                 const QuantLayout& layout, const AdamWHyper& h) {
  quantvec::adamw_step_quantised<simd::Scalar>(p, g, m, v, n, layout, h, fp8_decode_table(m.format),
                                               fp8_decode_table(v.format));
}

void quantise_state_scalar(const float* x, int64_t n, const QuantLayout& layout, QuantStateRef out) {
  quantvec::quantise_state<simd::Scalar>(x, n, layout, out);
}

void dequantise_state_scalar(QuantStateRef in, int64_t n, const QuantLayout& layout, float* x) {
  quantvec::dequantise_state<simd::Scalar>(in, n, layout, x, fp8_decode_table(in.format));
}

}  // namespace gale
