// Reading the JSON fixtures that the scripts under tools/reference/ write, and comparing with them.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace gale::testing {

// A JSON array of numbers as f32.
inline std::vector<float> json_floats(const nlohmann::json& j) {
  std::vector<float> v;
  for (const auto& x : j) v.push_back(static_cast<float>(x.get<double>()));
  return v;
}

// f32 results against a float64 reference of O(1) values, each a sum of at most a few hundred
// products: 1e-4 absolute + 1e-3 relative (f32 rounding stays near 1e-6; the rest is room for
// another CPU's GEMM blocking and libm).
inline void expect_near_reference(const float* got, const std::vector<float>& want, const std::string& what) {
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-4 + 1e-3 * std::fabs(want[i])) << what << " [" << i << "]";
}

}  // namespace gale::testing
