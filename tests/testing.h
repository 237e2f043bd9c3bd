// Helpers shared by Gale's tests: random data and finite-difference gradient checks.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/rng.h"

namespace gale::testing {

// Deterministic values uniform in [-scale, scale).
inline std::vector<float> random_vector(int64_t n, uint64_t seed, float scale = 1.0f) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = scale * (2.0f * uniform_at(seed, 0x7e57, static_cast<uint64_t>(i)) - 1.0f);
  return v;
}

inline void fill_random(float* x, int64_t n, uint64_t seed, float scale = 1.0f) {
  for (int64_t i = 0; i < n; ++i) x[i] = scale * (2.0f * uniform_at(seed, 0x7e57, static_cast<uint64_t>(i)) - 1.0f);
}

inline double dot(const float* a, const float* b, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// Central-difference directional derivative of `loss` along `dir` at `x` (x is restored):
// (loss(x + eps·dir) − loss(x − eps·dir)) / (2·eps).
inline double directional_derivative(const std::function<double()>& loss, float* x, const float* dir, int64_t n,
                                     double eps) {
  std::vector<float> saved(x, x + n);
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(saved[i] + eps * dir[i]);
  double plus = loss();
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(saved[i] - eps * dir[i]);
  double minus = loss();
  for (int64_t i = 0; i < n; ++i) x[i] = saved[i];
  return (plus - minus) / (2.0 * eps);
}

// The same derivative from the five-point stencil (−f(2h) + 8f(h) − 8f(−h) + f(−2h)) / 12h: its
// truncation error is O(h⁴) instead of O(h²), so h can be ten times larger, which divides the fp32
// rounding noise of the loss by about ten. For models whose losses are computed in fp32 through
// oneDNN GEMMs, whose rounding differs between CPUs (AVX-512 vs AVX2 kernels).
inline double directional_derivative_5point(const std::function<double()>& loss, float* x, const float* dir,
                                            int64_t n, double h) {
  std::vector<float> saved(x, x + n);
  auto at = [&](double t) {
    for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(saved[i] + t * dir[i]);
    return loss();
  };
  const double d = (-at(2 * h) + 8 * at(h) - 8 * at(-h) + at(-2 * h)) / (12.0 * h);
  for (int64_t i = 0; i < n; ++i) x[i] = saved[i];
  return d;
}

// |a − b| / max(|a|, |b|, floor)
inline double rel_diff(double a, double b, double floor = 1e-12) {
  return std::fabs(a - b) / std::max({std::fabs(a), std::fabs(b), floor});
}

inline double max_abs_diff(const float* a, const float* b, int64_t n) {
  double m = 0.0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, static_cast<double>(std::fabs(a[i] - b[i])));
  return m;
}

}  // namespace gale::testing
