// Bit-for-bit comparison of two trained TestRuns: losses, grad norms, and the first chunk's flat parameters and gradients.
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

}  // namespace gale::testing
