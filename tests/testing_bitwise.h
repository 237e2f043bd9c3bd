// Bit-for-bit comparison of two trained TestRuns: losses, grad norms, and the parameters and gradients.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "testing_run.h"

namespace gale::testing {

// `run` and `plain` trained the same iterations of the same model (same parameter layout): every
// loss and grad norm and every bit of the first chunk's parameters and gradients must agree.
inline void expect_runs_bit_identical(const TestRun& run, const TestRun& plain, const std::string& what) {
  EXPECT_EQ(run.losses, plain.losses) << what;
  EXPECT_EQ(run.grad_norms, plain.grad_norms) << what;
  const ParamBuffer& a = run.engine->chunks[0]->params();
  const ParamBuffer& b = plain.engine->chunks[0]->params();
  ASSERT_EQ(a.numel(), b.numel()) << what;
  const size_t bytes = static_cast<size_t>(a.numel()) * sizeof(float);
  EXPECT_EQ(0, std::memcmp(a.flat_params().data<float>(), b.flat_params().data<float>(), bytes)) << what << " params";
  EXPECT_EQ(0, std::memcmp(a.flat_grads().data<float>(), b.flat_grads().data<float>(), bytes)) << what << " grads";
}

// The same for runs with several model chunks (DualPipeV: two per rank), parameter by parameter: every
// chunk's gradients and its unsplit parameters (a ZeRO-split one is compared through its gradient).
// Returns how many compared parameters have `marker` in their name (for the caller to assert that
// what the test is about was compared).
inline int expect_chunks_bit_identical(const TestRun& run, const TestRun& plain, int iterations,
                                       const std::string& marker) {
  for (int i = 0; i < iterations; ++i) {
    EXPECT_EQ(run.losses[i], plain.losses[i]) << "loss of iteration " << i + 1;
    EXPECT_EQ(run.grad_norms[i], plain.grad_norms[i]) << "grad norm of iteration " << i + 1;
  }
  const auto same = [](const float* x, const float* y, int64_t n) {
    return std::memcmp(x, y, sizeof(float) * static_cast<size_t>(n)) == 0;
  };
  int compared = 0;
  EXPECT_EQ(run.engine->chunks.size(), plain.engine->chunks.size());
  for (size_t c = 0; c < run.engine->chunks.size() && c < plain.engine->chunks.size(); ++c) {
    const ParamBuffer& a = run.engine->chunks[c]->params();
    const ParamBuffer& b = plain.engine->chunks[c]->params();
    EXPECT_EQ(a.size(), b.size());
    for (int id = 0; id < a.size() && id < b.size(); ++id) {
      const int64_t n = shape_numel(a.spec(id).local_shape());
      EXPECT_TRUE(same(a.grad_data(id), b.grad_data(id), n)) << "gradient " << a.spec(id).name;
      if (!a.is_split(id)) EXPECT_TRUE(same(a.param_data(id), b.param_data(id), n)) << "parameter " << a.spec(id).name;
      compared += a.spec(id).name.find(marker) != std::string::npos;
    }
  }
  return compared;
}

}  // namespace gale::testing
