// Per-tensor FP8 quantise-dequantise, current scale and delayed-scaling update (TE's recipes).
#include "kernels/cpu/fp8_scaling.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "core/threads.h"
#include "kernels/cpu/fp8_codec.h"

namespace gale {

namespace {

constexpr int64_t kGrain = int64_t{1} << 14;

}  // namespace

void fp8_fake_quant_scaled(const float* x, float* out, int64_t n, float scale, float scale_inv, Fp8Format f) {
  const float* table = fp8_decode_table(f);
  parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float v = x[i];
      out[i] = std::isnan(v) ? v : table[fp8_encode(v * scale, f)] * scale_inv;
    }
  });
}

float fp8_amax(const float* x, int64_t n) {
  const int64_t chunks = (n + kGrain - 1) / kGrain;
  std::vector<float> part(static_cast<size_t>(chunks), 0.0f);
  parallel_for(chunks, 1, [&](int64_t cb, int64_t ce) {
    for (int64_t c = cb; c < ce; ++c) {
      float m = 0.0f;
      const int64_t e = std::min(n, (c + 1) * kGrain);
      for (int64_t i = c * kGrain; i < e; ++i) m = std::fmax(m, std::fabs(x[i]));
      part[static_cast<size_t>(c)] = m;
    }
  });
  float amax = 0.0f;
  for (float m : part) amax = std::max(amax, m);
  return amax;
}

float fp8_current_scale(float amax, Fp8Format f) { return fp8::linear_scale(amax, fp8_max(f)); }

void fp8_delayed_update(float* history, int64_t len, int64_t stride, float* scale, float fp8_max, int margin,
                        Fp8AmaxAlgo algo) {
  float amax = history[0];
  if (algo == Fp8AmaxAlgo::kMax)
    for (int64_t i = 1; i < len; ++i) amax = std::max(amax, history[i * stride]);
  if (std::isfinite(amax) && amax > 0.0f) {
    float s = (fp8_max / amax) / std::ldexp(1.0f, margin);
    if (std::isinf(s)) s = std::numeric_limits<float>::max();
    *scale = s;
  }
  const float first = history[0];
  for (int64_t i = 0; i + 1 < len; ++i) history[i * stride] = history[(i + 1) * stride];
  history[(len - 1) * stride] = first;
  history[0] = 0.0f;
}

void fp8_record_amax(float* slot, float amax) {
  // Non-negative floats order as their bit patterns; NaN never reaches here (fp8_amax ignores it).
  std::atomic_ref<uint32_t> a(*reinterpret_cast<uint32_t*>(slot));
  const uint32_t v = std::bit_cast<uint32_t>(amax);
  uint32_t cur = a.load(std::memory_order_relaxed);
  while (cur < v && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

}  // namespace gale
