// Reading the JSON fixtures that the scripts under tools/reference/ write, and comparing with them.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "model/params.h"

namespace gale::testing {

// A JSON array of numbers as f32.
inline std::vector<float> json_floats(const nlohmann::json& j) {
  std::vector<float> v;
  for (const auto& x : j) v.push_back(static_cast<float>(x.get<double>()));
  return v;
}

// A [rows, cols] f32 tensor of a JSON array of rows·cols numbers (row-major).
inline Tensor json_tensor(const nlohmann::json& j, int64_t rows, int64_t cols) {
  const std::vector<float> v = json_floats(j);
  GALE_CHECK_EQ(static_cast<int64_t>(v.size()), rows * cols) << "json_tensor";
  Tensor t = Tensor::empty({rows, cols});
  std::copy(v.begin(), v.end(), t.data<float>());
  return t;
}

// Sets each parameter {fixture name, id in pb} to the floats of inputs[name] (as many as it holds).
inline void set_params_from_json(ParamBuffer& pb, const std::vector<std::pair<const char*, int>>& params,
                                 const nlohmann::json& inputs) {
  for (const auto& [name, id] : params) {
    const std::vector<float> v = json_floats(inputs[name]);
    ASSERT_EQ(static_cast<int64_t>(v.size()), pb.spec(id).local_numel()) << name;
    pb.set_param_values(id, v.data());
  }
}

// f32 results against a float64 reference of O(1) values, each a sum of at most a few hundred
// products: 1e-4 absolute + 1e-3 relative (f32 rounding stays near 1e-6; the rest is room for
// another CPU's GEMM blocking and libm).
inline void expect_near_reference(const float* got, const std::vector<float>& want, const std::string& what) {
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-4 + 1e-3 * std::fabs(want[i])) << what << " [" << i << "]";
}

}  // namespace gale::testing
