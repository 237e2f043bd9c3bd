// YaRN rotary tables (frequency blend and concentration factor) for standard and multi-latent attention.
#include "model/yarn_rope.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace gale {

double yarn_mscale(double scale, double mscale) { return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

RopeTables make_yarn_rope_tables(const YarnConfig& y, int64_t max_positions, int64_t rot_dim, double base) {
  const int64_t R = rot_dim, half = R / 2;
  const double s = y.scaling_factor;
  if (s <= 1.0) return make_rope_tables(max_positions, R, base);
  GALE_CHECK(R > 0 && R % 2 == 0) << "YaRN rotary dimensions " << R;
  const double pi = 3.14159265358979323846;
  auto correction_dim = [&](double rotations) {
    return static_cast<double>(R) * std::log(static_cast<double>(y.original_max_positions) / (rotations * 2.0 * pi)) /
           (2.0 * std::log(base));
  };
  double low = correction_dim(y.beta_fast), high = correction_dim(y.beta_slow);
  if (y.round_to_int) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(R - 1));
  if (low == high) high += 0.001;
  const double concentration = yarn_mscale(s, y.mscale) / yarn_mscale(s, y.mscale_all_dim);
  RopeTables t;
  t.max_positions = max_positions;
  t.rot_dim = R;
  t.cos.resize(static_cast<size_t>(max_positions * half));
  t.sin.resize(t.cos.size());
  for (int64_t i = 0; i < half; ++i) {
    const double extra = std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(R));
    const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    const double inv_freq = extra / s * ramp + extra * (1.0 - ramp);
    for (int64_t p = 0; p < max_positions; ++p) {
      const double angle = static_cast<double>(p) * inv_freq;
      t.cos[static_cast<size_t>(p * half + i)] = static_cast<float>(concentration * std::cos(angle));
      t.sin[static_cast<size_t>(p * half + i)] = static_cast<float>(concentration * std::sin(angle));
    }
  }
  return t;
}

RopeTables make_mla_rope_tables(const MlaConfig& mla, int64_t max_positions, double base) {
  YarnConfig y;
  y.scaling_factor = mla.yarn ? mla.rotary_scaling_factor : 1.0;  // --rope-type rope: plain RoPE, cos/sin unscaled
  y.mscale = mla.mscale;
  y.mscale_all_dim = mla.mscale_all_dim;
  return make_yarn_rope_tables(y, max_positions, mla.qk_pos_emb_head_dim, base);
}

}  // namespace gale
