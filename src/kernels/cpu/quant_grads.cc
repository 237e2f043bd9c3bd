// --quant-grads' FP16 codec with a per-parameter scale (kernels/cpu/quant_grads.h).
#include "kernels/cpu/quant_grads.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

namespace gale {

float quant_grad_amax(const float* x, int64_t n) {
  float amax = 0.0f;
  bool nan = false;
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    nan = nan || std::isnan(a);
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
  for (int64_t i = 0; i < n; ++i) q[i] = float_to_f16(x[i] * scale);
}

void quant_grad_decode(const f16* q, int64_t n, float scale, float* x) {
  const float inv = quant_grad_scale_inv(scale);
  for (int64_t i = 0; i < n; ++i) x[i] = f16_to_float(q[i]) * inv;
}

void quant_grad_accumulate(f16* q, float* g, int64_t n, float* scale) {
  const float inv = quant_grad_scale_inv(*scale);
  for (int64_t i = 0; i < n; ++i) {
    const float held = f16_to_float(q[i]) * inv;  // two roundings, as dequantise-then-add
    g[i] = held + g[i];
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
  for (int64_t i = 0; i < n; ++i) q[i] = float_to_f16(f16_to_float(q[i]) * ratio);
}

}  // namespace gale
