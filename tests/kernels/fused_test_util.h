// Helpers for the fused-kernel tests: the ISA builds this machine can run, and error measures.
#pragma once

#include <cmath>
#include <cstring>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cpu/fused_ops.h"
#include "kernels/cpu/isa.h"

namespace gale::testing {

// Every build this CPU supports (scalar first).
inline std::vector<Isa> runnable_isas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512})
    if (fused_kernel_set(isa) != nullptr) out.push_back(isa);
  return out;
}

inline std::string isa_param_name(Isa isa) { return isa_name(isa); }

// max_i |a_i − b_i| / max(max_i |b_i|, floor): the error relative to the reference's peak.
inline double peak_rel_error(const float* a, const float* b, int64_t n, double floor = 1e-30) {
  double peak = floor, err = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    peak = std::max(peak, static_cast<double>(std::fabs(b[i])));
    double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    if (std::isnan(a[i]) != std::isnan(b[i])) d = INFINITY;
    err = std::max(err, d);
  }
  return err / peak;
}
// With a floor: for outputs that are exactly 0 in exact arithmetic (e.g. LayerNorm's dx for H = 1)
// the reference holds only rounding noise, so errors are measured against the output's natural scale.
inline double peak_rel_error(const std::vector<float>& a, const std::vector<float>& b, double floor = 1e-30) {
  return a.size() == b.size() ? peak_rel_error(a.data(), b.data(), static_cast<int64_t>(a.size()), floor) : INFINITY;
}

// Number of positions where the bit patterns differ.
inline int64_t bit_differences(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return -1;
  int64_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return n;
}

}  // namespace gale::testing
