// Per-tensor scaled fp16 / E4M3 optimizer moments (the precision-aware optimizer).
#include "kernels/cpu/scaled_states.h"

#include <algorithm>
#include <cmath>

#include <vector>

#include "core/threads.h"
#include "kernels/cpu/f16_convert.h"
#include "kernels/cpu/fp8_scaling.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/quant_states.h"

namespace gale {

bool parse_state_dtype(const std::string& name, StateDType* out) {
  if (name == "fp32") *out = StateDType::kF32;
  else if (name == "fp16") *out = StateDType::kF16;
  else if (name == "fp8") *out = StateDType::kFP8;
  else return false;
  return true;
}

const char* state_dtype_name(StateDType d) {
  return d == StateDType::kF32 ? "fp32" : d == StateDType::kF16 ? "fp16" : "fp8";
}

int64_t state_dtype_bytes(StateDType d) { return d == StateDType::kF32 ? 4 : d == StateDType::kF16 ? 2 : 1; }

float scaled_state_range(StateDType d) { return d == StateDType::kF16 ? 65504.0f / 2.0f : 448.0f; }

namespace {

// Elements per parallel chunk: the passes below run on the thread pool (the per-element rounding
// is exact, and so is the amax, fp8_amax, so the result does not depend on the split).
constexpr int64_t kGrain = int64_t{1} << 14;

}  // namespace

void quantise_scaled_state(float* x, int64_t n, ScaledStateRef out) {
  if (out.dtype == StateDType::kF32) {
    std::copy(x, x + n, static_cast<float*>(out.codes));
    return;
  }
  const float scale = fp8_amax(x, n) / scaled_state_range(out.dtype);
  *out.scale = scale;
  const float r = scale > 0.0f ? 1.0f / scale : 0.0f;
  const bool f16c = detected_isa() >= Isa::kAvx2;
  parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) x[i] *= r;
    if (out.dtype == StateDType::kF16) {
      f16* codes = static_cast<f16*>(out.codes) + b;
      (f16c ? convert_f32_to_f16_avx2 : convert_f32_to_f16_scalar)(x + b, codes, e - b);
      return;
    }
    uint8_t* codes = static_cast<uint8_t*>(out.codes);
    for (int64_t i = b; i < e; ++i) codes[i] = fp8_encode(x[i], Fp8Format::kE4M3);
  });
}

void dequantise_scaled_state(ScaledStateRef in, int64_t n, float* x) {
  if (in.dtype == StateDType::kF32) {
    const float* v = static_cast<const float*>(in.codes);
    std::copy(v, v + n, x);
    return;
  }
  const float scale = *in.scale;
  // fp8: the quantiser's scale q = 1 / scale and the dequantisation's 1 / q, both f32.
  const float inv = scale > 0.0f ? 1.0f / (1.0f / scale) : 0.0f;
  const float* table = fp8_decode_table(Fp8Format::kE4M3);
  const bool f16c = detected_isa() >= Isa::kAvx2;
  parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
    if (in.dtype == StateDType::kF16) {
      (f16c ? convert_f16_to_f32_avx2 : convert_f16_to_f32_scalar)(static_cast<const f16*>(in.codes) + b, x + b, e - b);
#pragma omp simd
      for (int64_t i = b; i < e; ++i) x[i] *= scale;
      return;
    }
    const uint8_t* codes = static_cast<const uint8_t*>(in.codes);
    for (int64_t i = b; i < e; ++i) x[i] = table[codes[i]] * inv;
  });
}

void adamw_step_scaled(float* p, const float* g, ScaledStateRef m, ScaledStateRef v, int64_t n,
                       const AdamWHyper& h, float* m32, float* v32,
                       void (*step)(float*, const float*, float*, float*, int64_t, const AdamWHyper&)) {
  float* mm = m.dtype == StateDType::kF32 ? static_cast<float*>(m.codes) : m32;
  float* vv = v.dtype == StateDType::kF32 ? static_cast<float*>(v.codes) : v32;
  if (m.dtype != StateDType::kF32) dequantise_scaled_state(m, n, mm);
  if (v.dtype != StateDType::kF32) dequantise_scaled_state(v, n, vv);
  step(p, g, mm, vv, n, h);
  if (m.dtype != StateDType::kF32) quantise_scaled_state(mm, n, m);
  if (v.dtype != StateDType::kF32) quantise_scaled_state(vv, n, v);
}

}  // namespace gale
