// --quant-grads codec (kernels/cpu/quant_grads.h): every accumulation step, the scale rule and the
// data-parallel rescaling bit for bit against the numpy fixture (tools/reference/quant_grads_reference.py),
// and the FP16 main gradient after several micro-batches within the bound FP16's rounding gives of
// the exact (double) sum.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "core/check.h"
#include "kernels/reference_fixture.h"
#include "kernels/cpu/quant_grads.h"

namespace gale {
namespace {

using testing::bits;
using testing::from_bits;

const nlohmann::json& golden() {
  static const nlohmann::json j = testing::load_reference_json("quant_grads/golden.json");
  return j;
}

TEST(QuantGradsCodec, AccumulationMatchesFixtureBitForBit) {
  int cases = 0;
  for (const auto& c : golden()["accumulate"]) {
    const std::string name = c["name"];
    const int64_t n = c["numel"];
    std::vector<f16> q(static_cast<size_t>(n));
    float scale = 1.0f;
    int step = 0;
    for (const auto& s : c["steps"]) {
      std::vector<float> g(static_cast<size_t>(n)), deq(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) g[i] = from_bits(s["g"][i].get<uint32_t>());
      quant_grad_accumulate(q.data(), g.data(), n, &scale);
      ASSERT_EQ(bits(scale), s["scale"].get<uint32_t>()) << name << " step " << step;
      quant_grad_decode(q.data(), n, scale, deq.data());
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(q[i].bits, s["codes"][i].get<uint16_t>()) << name << " step " << step << " element " << i;
        ASSERT_EQ(bits(deq[i]), s["dequantised"][i].get<uint32_t>()) << name << " step " << step << " element " << i;
        ASSERT_EQ(g[i], 0.0f) << "the f32 contribution is left zero";
      }
      ++step;
    }
    ++cases;
  }
  EXPECT_EQ(cases, 10);
}

TEST(QuantGradsCodec, ScaleRuleMatchesFixture) {
  for (const auto& c : golden()["scale_rule"]) {
    const float amax = from_bits(c["amax"].get<uint32_t>()), old = from_bits(c["old"].get<uint32_t>());
    EXPECT_EQ(bits(quant_grad_update_scale(amax, old)), c["scale"].get<uint32_t>()) << amax << " " << old;
  }
  // The rule's cases by hand: amax 0, inf, NaN keep the scale; an overflowing quotient is FLT_MAX.
  EXPECT_EQ(quant_grad_update_scale(0.0f, 7.0f), 7.0f);
  EXPECT_EQ(quant_grad_update_scale(INFINITY, 7.0f), 7.0f);
  EXPECT_EQ(quant_grad_update_scale(NAN, 7.0f), 7.0f);
  EXPECT_EQ(quant_grad_update_scale(1e-36f, 1.0f), 3.40282347e38f);
  EXPECT_EQ(quant_grad_update_scale(2.0f, 1.0f), 65503.0f / 2.0f);
}

TEST(QuantGradsCodec, RescaleMatchesFixture) {
  for (const auto& c : golden()["rescale"]) {
    std::vector<f16> q;
    for (const auto& b : c["codes"]) q.push_back(f16{b.get<uint16_t>()});
    quant_grad_rescale(q.data(), static_cast<int64_t>(q.size()), from_bits(c["old"].get<uint32_t>()),
                       from_bits(c["new"].get<uint32_t>()));
    for (size_t i = 0; i < q.size(); ++i) ASSERT_EQ(q[i].bits, c["out"][i].get<uint16_t>()) << i;
  }
}

// M micro-batches of gradients of different magnitudes accumulated into the FP16 main gradient vs
// the exact sum. Each accumulation k rounds x_k = deq(q_{k-1}) + g_k three times in f32 (the
// dequantising multiply, the add, the scaling multiply: at most 3·2^-24 relative) and once to FP16:
// x_k·s_k lies within ±65503, so a normal FP16 result is within half an ulp, 2^-11 relative, and a
// subnormal one within 2^-25 absolute (2^-25 / s_k unscaled). Per element, then,
//   |deq(q_M) − Σ g_k| ≤ Σ_k [(2^-11 + 2^-21)·|x_k| + 2^-25 / s_k],
// with x_k replayed in double from the held codes. The f32 accumulation of the same gradients is
// checked against the same exact sum for comparison (its error is far smaller).
TEST(QuantGradsCodec, AccumulationWithinFp16RoundingOfExactSum) {
  std::mt19937 rng(7);
  const int64_t n = 4096;
  const int M = 8;
  std::vector<f16> q(n);
  std::vector<double> exact(n, 0.0);
  std::vector<double> bound(n, 0.0);
  std::vector<float> f32_sum(n, 0.0f);
  float scale = 1.0f;
  double worst_ratio = 0.0, max_err = 0.0;
  for (int k = 0; k < M; ++k) {
    std::normal_distribution<float> dist(0.0f, std::pow(10.0f, -3.0f + 0.5f * static_cast<float>(k % 4)));
    std::vector<float> g(n);
    for (auto& v : g) v = dist(rng);
    const float inv = quant_grad_scale_inv(scale);
    std::vector<double> x(n);
    for (int64_t i = 0; i < n; ++i) x[i] = static_cast<double>(f16_to_float(q[i]) * inv) + g[i];
    for (int64_t i = 0; i < n; ++i) {
      exact[i] += g[i];
      f32_sum[i] += g[i];
    }
    quant_grad_accumulate(q.data(), g.data(), n, &scale);
    for (int64_t i = 0; i < n; ++i) bound[i] += (0x1p-11 + 0x1p-21) * std::fabs(x[i]) + 0x1p-25 / scale;
  }
  std::vector<float> deq(n);
  quant_grad_decode(q.data(), n, scale, deq.data());
  double f32_err = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double err = std::fabs(deq[i] - exact[i]);
    ASSERT_LE(err, bound[i]) << "element " << i;
    worst_ratio = std::max(worst_ratio, err / bound[i]);
    max_err = std::max(max_err, err);
    f32_err = std::max(f32_err, std::fabs(f32_sum[i] - exact[i]));
  }
  std::printf("quant-grads: %d accumulations, max |error| %.3g (f32 accumulation %.3g), worst error / bound %.3f\n", M,
              max_err, f32_err, worst_ratio);
  EXPECT_GT(max_err, 10 * f32_err) << "the FP16 rounding must show";
}

}  // namespace
}  // namespace gale
