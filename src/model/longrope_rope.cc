// LongRoPE rotary tables (per-pair frequency divisors, cos/sin scale) and the short / long choice.
#include "model/longrope_rope.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace gale {

double longrope_default_mscale(int64_t max_positions, int64_t original_max_positions) {
  const double scale = static_cast<double>(max_positions) / static_cast<double>(original_max_positions);
  if (scale <= 1.0) return 1.0;
  return std::sqrt(1.0 + std::log(scale) / std::log(static_cast<double>(original_max_positions)));
}

RopeTables make_longrope_tables(const LongRopeConfig& lr, bool use_long, int64_t max_positions, int64_t rot_dim,
                                double base) {
  const int64_t R = rot_dim, half = R / 2;
  const std::vector<double>& factor = use_long ? lr.long_factor : lr.short_factor;
  const double mscale = use_long ? lr.long_mscale : lr.short_mscale;
  GALE_CHECK(R > 0 && R % 2 == 0) << "LongRoPE rotary dimensions " << R;
  GALE_CHECK_EQ(static_cast<int64_t>(factor.size()), half) << "LongRoPE factors per rotary pair";
  RopeTables t;
  t.max_positions = max_positions;
  t.rot_dim = R;
  t.cos.resize(static_cast<size_t>(max_positions * half));
  t.sin.resize(t.cos.size());
  for (int64_t i = 0; i < half; ++i) {
    const double inv_freq =
        1.0 / (factor[static_cast<size_t>(i)] * std::pow(base, 2.0 * static_cast<double>(i) / static_cast<double>(R)));
    for (int64_t p = 0; p < max_positions; ++p) {
      const double angle = static_cast<double>(p) * inv_freq;
      t.cos[static_cast<size_t>(p * half + i)] = static_cast<float>(mscale * std::cos(angle));
      t.sin[static_cast<size_t>(p * half + i)] = static_cast<float>(mscale * std::sin(angle));
    }
  }
  return t;
}

bool longrope_use_long(const LongRopeConfig& lr, bool by_length, const int32_t* positions, int64_t count) {
  if (!by_length) return lr.long_without_cache;
  int64_t largest = -1;
  for (int64_t k = 0; k < count; ++k) largest = std::max<int64_t>(largest, positions[k]);
  return largest + 1 > lr.original_max_positions;
}

}  // namespace gale
