// The reference GeGLU kernels (kernels/cpu/geglu.h): forward against the plain GeLU kernels times the
// linear half, backward against five-point finite differences, and the bias and its gradient.
#include "kernels/cpu/geglu.h"

#include <gtest/gtest.h>

#include <vector>

#include "kernels/cpu/activation.h"
#include "testing.h"

namespace gale {
namespace {

using testing::random_vector;

constexpr int64_t kRows = 5, kF = 7;

class Geglu : public ::testing::TestWithParam<GegluGate> {};

// act = gelu(gate)·up with the same GeLU the plain MLP uses (exact or tanh, kernels/cpu/activation.h).
TEST_P(Geglu, ForwardIsTheGeluOfTheGateTimesTheLinearHalf) {
  const GegluGate gate = GetParam();
  std::vector<float> u = random_vector(kRows * 2 * kF, 3, 2.0f), act(kRows * kF);
  const std::vector<float> u0 = u;
  geglu_forward_ref(gate, u.data(), nullptr, act.data(), kRows, kF);
  EXPECT_EQ(u, u0);  // no bias: fc1's output untouched
  for (int64_t r = 0; r < kRows; ++r) {
    std::vector<float> g(kF);
    if (gate == GegluGate::kErf)
      gelu_forward_ref(u.data() + r * 2 * kF, g.data(), kF);
    else
      gelu_tanh_forward_ref(u.data() + r * 2 * kF, g.data(), kF);
    for (int64_t i = 0; i < kF; ++i) EXPECT_EQ(act[r * kF + i], g[i] * u[r * 2 * kF + kF + i]) << r << "," << i;
  }
}

// d/du of Σ dact·act by five-point differences in float64 of the float kernel (h = 1e-2 on O(1)
// inputs: truncation ~1e-8, rounding ~1e-5 relative), per element.
TEST_P(Geglu, BackwardMatchesFiniteDifferences) {
  const GegluGate gate = GetParam();
  const std::vector<float> u = random_vector(kRows * 2 * kF, 5, 2.0f), dact = random_vector(kRows * kF, 6);
  std::vector<float> du(kRows * 2 * kF, 123.0f);
  geglu_backward_ref(gate, dact.data(), u.data(), du.data(), nullptr, kRows, kF);
  auto objective = [&](std::vector<float> x) {
    std::vector<float> act(kRows * kF);
    geglu_forward_ref(gate, x.data(), nullptr, act.data(), kRows, kF);
    double s = 0.0;
    for (size_t i = 0; i < act.size(); ++i) s += static_cast<double>(dact[i]) * act[i];
    return s;
  };
  const float h = 1e-2f;
  for (size_t i = 0; i < u.size(); ++i) {
    auto at = [&](float step) {
      std::vector<float> x = u;
      x[i] += step;
      return objective(x);
    };
    const double numeric = (8.0 * (at(h) - at(-h)) - (at(2 * h) - at(-2 * h))) / (12.0 * h);
    EXPECT_NEAR(du[i], numeric, 2e-3 * std::max(1.0, std::fabs(numeric))) << i;
  }
}

// With a bias: the bias is added to u in place before the activation, and its gradient is the
// column sum of du, added to what dbias held.
TEST_P(Geglu, BiasIsAddedInPlaceAndItsGradientIsTheColumnSum) {
  const GegluGate gate = GetParam();
  const std::vector<float> bias = random_vector(2 * kF, 8), u0 = random_vector(kRows * 2 * kF, 9);
  std::vector<float> u = u0, act(kRows * kF), with_bias = u0, act2(kRows * kF);
  geglu_forward_ref(gate, u.data(), bias.data(), act.data(), kRows, kF);
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t j = 0; j < 2 * kF; ++j) with_bias[r * 2 * kF + j] += bias[j];
  EXPECT_EQ(u, with_bias);
  geglu_forward_ref(gate, with_bias.data(), nullptr, act2.data(), kRows, kF);
  EXPECT_EQ(act, act2);
  const std::vector<float> dact = random_vector(kRows * kF, 10);
  std::vector<float> du(kRows * 2 * kF), dbias(2 * kF, 0.5f);
  geglu_backward_ref(gate, dact.data(), u.data(), du.data(), dbias.data(), kRows, kF);
  for (int64_t j = 0; j < 2 * kF; ++j) {
    double s = 0.5;
    for (int64_t r = 0; r < kRows; ++r) s += du[r * 2 * kF + j];
    EXPECT_NEAR(dbias[j], s, 1e-5) << j;
  }
}

INSTANTIATE_TEST_SUITE_P(Gates, Geglu, ::testing::Values(GegluGate::kErf, GegluGate::kTanh),
                         [](const auto& info) { return info.param == GegluGate::kErf ? "erf" : "tanh"; });

}  // namespace
}  // namespace gale
