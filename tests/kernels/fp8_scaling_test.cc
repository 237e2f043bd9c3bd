// Per-tensor FP8 scaling (kernels/cpu/fp8_scaling.h) against the numpy / ml_dtypes fixture
// (tools/reference/fp8_scaling_reference.py), bit for bit: E4M3 and E5M2 quantise-dequantise with
// saturation, subnormals, ties, NaN and ±Inf; the current-scaling scale; the delayed-scaling update
// over ten steps for history lengths 1 and 3, both amax algorithms and margins 0 and 2. Plus MX
// E5M2 (kernels/cpu/mx_quant.h): the fast kernel equals the reference.
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kernels/cpu/fp8_scaling.h"
#include "kernels/cpu/mx_quant.h"

namespace gale {
namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
std::vector<float> floats_of_bits(const nlohmann::json& j) {
  std::vector<float> v;
  for (const auto& b : j) v.push_back(float_of(b.get<uint32_t>()));
  return v;
}
Fp8Format format_of(const std::string& s) { return s == "e5m2" ? Fp8Format::kE5M2 : Fp8Format::kE4M3; }

nlohmann::json load_fixture() {
  std::ifstream in(std::string(GALE_TEST_DATA_DIR) + "/reference/fp8_scaling/golden.json");
  EXPECT_TRUE(in.good()) << "tests/data/reference/fp8_scaling/golden.json (tools/reference/fp8_scaling_reference.py)";
  return nlohmann::json::parse(in);
}

// A NaN matches any NaN (TE keeps NaN; its payload is not specified); everything else bit for bit.
void expect_same(float got, float want, const std::string& what) {
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got)) << what << ": " << got;
    return;
  }
  EXPECT_EQ(bits_of(got), bits_of(want)) << what << ": got " << got << ", want " << want;
}

TEST(Fp8Scaling, QuantiseDequantiseMatchesMlDtypes) {
  const nlohmann::json golden = load_fixture();
  ASSERT_GE(golden["cases"].size(), 10u);
  int saturated = 0, subnormal = 0, nan = 0;
  for (const auto& c : golden["cases"]) {
    const std::vector<float> x = floats_of_bits(c["x"]), want = floats_of_bits(c["y"]);
    const float scale = float_of(c["scale"].get<uint32_t>());
    const Fp8Format f = format_of(c["format"]);
    std::vector<float> y(x.size());
    fp8_fake_quant_scaled(x.data(), y.data(), static_cast<int64_t>(x.size()), scale, 1.0f / scale, f);
    for (size_t i = 0; i < x.size(); ++i) {
      expect_same(y[i], want[i], c["format"].get<std::string>() + " scale " + std::to_string(scale) + " x " +
                                     std::to_string(x[i]));
      saturated += std::fabs(want[i] * scale) == fp8_max(f) && std::fabs(x[i] * scale) > fp8_max(f);
      subnormal += want[i] != 0 && std::fabs(want[i] * scale) < (f == Fp8Format::kE4M3 ? 0x1p-6f : 0x1p-14f);
      nan += std::isnan(want[i]);
    }
  }
  EXPECT_GT(saturated, 10) << "the fixture must exercise saturation";
  EXPECT_GT(subnormal, 10) << "the fixture must exercise subnormals";
  EXPECT_GT(nan, 5) << "the fixture must exercise NaN";
}

TEST(Fp8Scaling, CurrentScaleMatchesReference) {
  const nlohmann::json golden = load_fixture();
  for (const auto& c : golden["current"]) {
    const float amax = float_of(c["amax"].get<uint32_t>());
    EXPECT_EQ(bits_of(fp8_current_scale(amax, format_of(c["format"]))), c["scale"].get<uint32_t>())
        << c["format"] << " amax " << amax;
  }
}

TEST(Fp8Scaling, DelayedUpdateMatchesReferenceOverSteps) {
  const nlohmann::json golden = load_fixture();
  ASSERT_EQ(golden["delayed"].size(), 16u);
  for (const auto& t : golden["delayed"]) {
    const int64_t len = t["len"];
    const Fp8AmaxAlgo algo = t["algo"] == "max" ? Fp8AmaxAlgo::kMax : Fp8AmaxAlgo::kMostRecent;
    const Fp8Format f = format_of(t["format"]);
    // Two interleaved tensors (stride 2): the second must not disturb the first.
    std::vector<float> history(static_cast<size_t>(2 * len), 0.0f);
    float scale[2] = {1.0f, 1.0f};
    int step = 0;
    for (const auto& s : t["steps"]) {
      const float amax = float_of(s["amax"].get<uint32_t>());
      fp8_record_amax(&history[0], amax / 2);  // two quantisations in the step: the larger counts
      fp8_record_amax(&history[0], amax);
      fp8_record_amax(&history[1], 5.0f);
      fp8_delayed_update(history.data(), len, 2, &scale[0], fp8_max(f), t["margin"], algo);
      fp8_delayed_update(history.data() + 1, len, 2, &scale[1], fp8_max(f), t["margin"], algo);
      const std::string what = std::string(t["format"]) + " len " + std::to_string(len) + " " +
                               std::string(t["algo"]) + " margin " + std::to_string(int(t["margin"])) + " step " +
                               std::to_string(++step);
      EXPECT_EQ(bits_of(scale[0]), s["scale"].get<uint32_t>()) << what;
      const std::vector<float> want = floats_of_bits(s["history"]);
      for (int64_t i = 0; i < len; ++i) EXPECT_EQ(bits_of(history[2 * i]), bits_of(want[i])) << what << " [" << i << "]";
      EXPECT_EQ(scale[1], fp8_max(f) / 5.0f / std::ldexp(1.0f, t["margin"])) << what;
    }
  }
}

// NaN is ignored by the amax, ±Inf counts (TE's fmaxf).
TEST(Fp8Scaling, AmaxIgnoresNan) {
  std::vector<float> x(40000, 0.5f);
  x[17] = -3.0f;
  x[30000] = std::nanf("");
  EXPECT_EQ(fp8_amax(x.data(), static_cast<int64_t>(x.size())), 3.0f);
  x[39999] = -INFINITY;
  EXPECT_EQ(fp8_amax(x.data(), static_cast<int64_t>(x.size())), INFINITY);
  EXPECT_EQ(fp8_amax(x.data(), 0), 0.0f);
}

// MX with E5M2 elements (--fp8-recipe mxfp8 --fp8-format hybrid's gradients): the vectorised kernel
// equals the readable reference bit for bit, and E5M2 keeps 2 mantissa bits under a power-of-two scale.
TEST(Fp8Scaling, MxE5m2FastEqualsReference) {
  std::mt19937 gen(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t rows = 7, cols = 100;
  std::vector<float> x(rows * cols);
  for (size_t i = 0; i < x.size(); ++i) x[i] = normal(gen) * std::ldexp(1.0f, static_cast<int>(i % 40) - 20);
  x[5] = 0.0f;
  std::vector<float> a(x.size()), b(x.size());
  mx_fake_quant_reference(x.data(), a.data(), rows, cols, 32, MxElement::kFp8E5M2);
  mx_fake_quant(x.data(), b.data(), rows, cols, 32, MxElement::kFp8E5M2);
  int changed = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(bits_of(a[i]), bits_of(b[i])) << i;
    changed += a[i] != x[i];
  }
  EXPECT_GT(changed, static_cast<int>(x.size()) / 2);
  EXPECT_EQ(mx_element_max(MxElement::kFp8E5M2), 57344.0f);
  EXPECT_EQ(mx_element_emax(MxElement::kFp8E5M2), 15);
  float one[1] = {1.375f}, q[1];  // 1.011b: rounds to 1.5 with 2 mantissa bits (tie to even 1.10b)
  mx_fake_quant(one, q, 1, 1, 32, MxElement::kFp8E5M2);
  EXPECT_EQ(q[0], 1.5f);
}

}  // namespace
}  // namespace gale
