// Reference RoPE kernels and tables.
#include "kernels/cpu/rope.h"

#include <cmath>

#include "core/check.h"
#include "core/threads.h"

namespace gale {

double llama3_scaled_inv_freq(double inv_freq, double factor) {
  constexpr double kLowFreqFactor = 1.0, kHighFreqFactor = 4.0, kOriginalContext = 8192.0;
  const double pi = 3.14159265358979323846;
  const double wavelen = 2.0 * pi / inv_freq;
  if (wavelen < kOriginalContext / kHighFreqFactor) return inv_freq;
  if (wavelen > kOriginalContext / kLowFreqFactor) return inv_freq / factor;
  const double smooth = (kOriginalContext / wavelen - kLowFreqFactor) / (kHighFreqFactor - kLowFreqFactor);
  return (1.0 - smooth) * inv_freq / factor + smooth * inv_freq;
}

RopeTables make_rope_tables(int64_t max_positions, int64_t rot_dim, double base, double llama3_scaling_factor,
                            double position_scale) {
  GALE_CHECK(rot_dim > 0 && rot_dim % 2 == 0) << "rot_dim " << rot_dim;
  RopeTables t;
  t.max_positions = max_positions;
  t.rot_dim = rot_dim;
  int64_t half = rot_dim / 2;
  t.cos.resize(static_cast<size_t>(max_positions * half));
  t.sin.resize(t.cos.size());
  for (int64_t p = 0; p < max_positions; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      double inv_freq = std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(rot_dim));
      if (llama3_scaling_factor > 0.0) inv_freq = llama3_scaled_inv_freq(inv_freq, llama3_scaling_factor);
      double angle = static_cast<double>(p) * position_scale * inv_freq;
      t.cos[static_cast<size_t>(p * half + i)] = static_cast<float>(std::cos(angle));
      t.sin[static_cast<size_t>(p * half + i)] = static_cast<float>(std::sin(angle));
    }
  }
  return t;
}

namespace {
void rope_apply(float* x, const HeadLayout& layout, int64_t heads, int64_t S, int64_t B, int64_t HD,
                const int32_t* position_ids, const RopeTables& tables, float sin_sign) {
  int64_t half = tables.rot_dim / 2;
  GALE_CHECK_LE(tables.rot_dim, HD);
  parallel_for(S * B, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      int64_t s = t / B, b = t % B;
      int64_t pos = position_ids[b * S + s];
      GALE_CHECK(pos >= 0 && pos < tables.max_positions) << "position " << pos << " outside the RoPE table of "
                                                         << tables.max_positions;
      const float* c = tables.cos.data() + pos * half;
      const float* sn = tables.sin.data() + pos * half;
      for (int64_t h = 0; h < heads; ++h) {
        float* v = x + layout.offset(t, h);
        // The pair rotated at frequency i: (v[i], v[i + half]), or (v[2i], v[2i + 1]) interleaved.
        const int64_t first_step = tables.interleaved ? 2 : 1, second_offset = tables.interleaved ? 1 : half;
        for (int64_t i = 0; i < half; ++i) {
          float* a = v + i * first_step;
          float* b = a + second_offset;
          float x1 = *a, x2 = *b;
          float si = sin_sign * sn[i];
          *a = x1 * c[i] - x2 * si;
          *b = x2 * c[i] + x1 * si;
        }
      }
    }
  });
}
}  // namespace

void rope_forward_ref(float* x, const HeadLayout& layout, int64_t heads, int64_t S, int64_t B, int64_t HD,
                      const int32_t* position_ids, const RopeTables& tables) {
  rope_apply(x, layout, heads, S, B, HD, position_ids, tables, 1.0f);
}

void rope_backward_ref(float* dx, const HeadLayout& layout, int64_t heads, int64_t S, int64_t B, int64_t HD,
                       const int32_t* position_ids, const RopeTables& tables) {
  rope_apply(dx, layout, heads, S, B, HD, position_ids, tables, -1.0f);
}

}  // namespace gale
