// --quant-grads' FP16 codec with a per-parameter scale (kernels/cpu/quant_grads.h). The FP16
// conversions go through the F16C kernels where the CPU has them (kernels/cpu/f16_convert.h, bit-identical
// to core/dtype.h's float_to_f16 / f16_to_float), in chunks of a stack buffer.
#include "kernels/cpu/quant_grads.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "kernels/cpu/f16_convert.h"
#include "kernels/cpu/isa.h"

namespace gale {

namespace {

constexpr int64_t kChunk = 2048;

using ToF32 = void (*)(const f16*, float*, int64_t);
using ToF16 = void (*)(const float*, f16*, int64_t);
ToF32 to_f32() { return detected_isa() >= Isa::kAvx2 ? convert_f16_to_f32_avx2 : convert_f16_to_f32_scalar; }
ToF16 to_f16() { return detected_isa() >= Isa::kAvx2 ? convert_f32_to_f16_avx2 : convert_f32_to_f16_scalar; }

}  // namespace

float quant_grad_amax(const float* x, int64_t n) {
  float amax = 0.0f;
  bool nan = false;
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    nan = nan || (a != a);
    amax = a > amax ? a : amax;
  }
  return nan ? NAN : amax;
}

float quant_grad_update_scale(float amax, float old_scale) {
  if (!(amax > 0.0f) || !std::isfinite(amax)) return old_scale;
  const float s = kQuantGradTarget / amax;
  return std::isinf(s) ? FLT_MAX : s;
}

float quant_grad_scale_inv(float scale) { return 1.0f / (scale == 0.0f ? 1.0f : scale); }

void quant_grad_encode(const float* x, int64_t n, float scale, f16* q) {
  const ToF16 cvt = to_f16();
  float buf[kChunk];
  for (int64_t b = 0; b < n; b += kChunk) {
    const int64_t m = std::min(kChunk, n - b);
    for (int64_t i = 0; i < m; ++i) buf[i] = x[b + i] * scale;
    cvt(buf, q + b, m);
  }
}

void quant_grad_decode(const f16* q, int64_t n, float scale, float* x) {
  const float inv = quant_grad_scale_inv(scale);
  to_f32()(q, x, n);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void quant_grad_accumulate(f16* q, float* g, int64_t n, float* scale) {
  const float inv = quant_grad_scale_inv(*scale);
  const ToF32 cvt = to_f32();
  float buf[kChunk];
  for (int64_t b = 0; b < n; b += kChunk) {
    const int64_t m = std::min(kChunk, n - b);
    cvt(q + b, buf, m);
    for (int64_t i = 0; i < m; ++i) g[b + i] = buf[i] * inv + g[b + i];  // two roundings: dequantise, then add
  }
  *scale = quant_grad_update_scale(quant_grad_amax(g, n), *scale);
  quant_grad_encode(g, n, *scale, q);
  std::memset(g, 0, static_cast<size_t>(n) * sizeof(float));
}

void quant_grad_rescale(f16* q, int64_t n, float old_scale, float new_scale) {
  if (old_scale == new_scale) return;
  if (old_scale == 0.0f) {
    std::fill(q, q + n, f16{});
    return;
  }
  const float ratio = new_scale / old_scale;
  const ToF32 widen = to_f32();
  const ToF16 narrow = to_f16();
  float buf[kChunk];
  for (int64_t b = 0; b < n; b += kChunk) {
    const int64_t m = std::min(kChunk, n - b);
    widen(q + b, buf, m);
    for (int64_t i = 0; i < m; ++i) buf[i] *= ratio;
    narrow(buf, q + b, m);
  }
}

void quant_grad_round_and_decode(float* x, int64_t n, float scale, f16* q) {
  const float inv = quant_grad_scale_inv(scale);
  to_f16()(x, q, n);
  to_f32()(q, x, n);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace gale
