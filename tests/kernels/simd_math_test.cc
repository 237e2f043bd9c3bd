// Vector math of every ISA build: exp and erf accuracy against libm in double, and dropout masks
// bit-identical to core/rng.h's uniform_at.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/rng.h"
#include "fused_test_util.h"

namespace gale {
namespace {

using testing::runnable_isas;

// |y − ref| in units of the float spacing at ref (ulp of the correctly rounded result).
double ulp_error(float y, double ref) {
  if (std::isnan(ref)) return std::isnan(y) ? 0.0 : INFINITY;
  if (std::isinf(ref)) return y == static_cast<float>(ref) ? 0.0 : INFINITY;
  const float rf = static_cast<float>(ref);
  const double ulp = std::max(static_cast<double>(std::nextafter(std::fabs(rf), INFINITY) - std::fabs(rf)),
                              static_cast<double>(std::numeric_limits<float>::denorm_min()));
  return std::fabs(static_cast<double>(y) - ref) / ulp;
}

class SimdMath : public ::testing::TestWithParam<Isa> {
 protected:
  const FusedKernelSet& set() { return *fused_kernel_set(GetParam()); }
};

TEST_P(SimdMath, ExpWithinTwoUlpAndSpecialValues) {
  std::vector<float> x;
  for (double v = -103.9; v < 88.7; v += 0.0137) x.push_back(static_cast<float>(v));
  for (float v : {0.0f, -0.0f, 1e-30f, -1e-30f, 88.72f, -87.3f, -87.4f, -100.0f, 1.0f, -1.0f}) x.push_back(v);
  std::vector<float> y(x.size());
  set().exp(x.data(), y.data(), static_cast<int64_t>(x.size()));
  double worst = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    double ref = std::exp(static_cast<double>(x[i]));
    // Results below e^−87 ≈ 1.6e-38 (just above the smallest normal float) are flushed to 0.
    if (x[i] < -87.0f)
      EXPECT_LE(std::fabs(y[i] - ref), 1.7e-38) << x[i];
    else
      worst = std::max(worst, ulp_error(y[i], ref));
  }
  EXPECT_LE(worst, 2.0);
  std::vector<float> special = {-INFINITY, INFINITY, NAN, -200.0f, 200.0f, 88.8f};
  std::vector<float> out(special.size());
  set().exp(special.data(), out.data(), static_cast<int64_t>(special.size()));
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[1], INFINITY);
  EXPECT_TRUE(std::isnan(out[2]));
  EXPECT_EQ(out[3], 0.0f);
  EXPECT_EQ(out[4], INFINITY);
  EXPECT_EQ(out[5], INFINITY);
  RecordProperty("exp_max_ulp", std::to_string(worst));
}

TEST_P(SimdMath, ErfWithinTwoAndAHalfUlpOfMaxErfOrOneEighth) {
  std::vector<float> x;
  for (double v = -6.0; v <= 6.0; v += 0.000731) x.push_back(static_cast<float>(v));
  for (float v : {0.0f, -0.0f, 1e-20f, 1.0f, -1.0f, 0.99999f, 1.00001f, 4.0f, 10.0f, -10.0f}) x.push_back(v);
  std::vector<float> y(x.size());
  set().erf(x.data(), y.data(), static_cast<int64_t>(x.size()));
  double worst_rel = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double ref = std::erf(static_cast<double>(x[i]));
    // Error in ulps of max(|erf(x)|, 1/8): relative near 0, absolute (as 1 + erf needs) elsewhere.
    const double scale = std::max(std::fabs(ref), 0.125);
    const double ulp = std::nextafter(static_cast<float>(scale), INFINITY) - static_cast<float>(scale);
    worst_rel = std::max(worst_rel, std::fabs(y[i] - ref) / ulp);
  }
  EXPECT_LE(worst_rel, 2.5);  // measured 2.02 (AVX2 and AVX-512), near |x| = 1
  std::vector<float> special = {NAN, INFINITY, -INFINITY};
  std::vector<float> out(3);
  set().erf(special.data(), out.data(), 3);
  EXPECT_TRUE(std::isnan(out[0]));
  EXPECT_EQ(out[1], 1.0f);
  EXPECT_EQ(out[2], -1.0f);
  RecordProperty("erf_max_ulp", std::to_string(worst_rel));
}

TEST_P(SimdMath, DropoutMaskIsBitIdenticalToUniformAt) {
  struct Case {
    uint64_t seed, stream, base;
    float p;
  };
  // Bases around the 32-bit carry of the counter, and large ones.
  for (const Case& c : {Case{1, 2, 0, 0.1f}, Case{1234567, 0xD7D7, 0xFFFFFFF0ull, 0.5f},
                        Case{~0ull, ~0ull, (7ull << 32) - 5, 0.9f}, Case{42, 17, 123456789012345ull, 0.3f},
                        Case{3, 5, 1000, 1.0f / 3.0f}}) {
    const int64_t n = 301;
    std::vector<uint8_t> keep(n);
    set().dropout_keep(c.seed, c.stream, c.p, c.base, n, keep.data());
    int64_t mismatches = 0, kept = 0;
    for (int64_t i = 0; i < n; ++i) {
      const bool ref = uniform_at(c.seed, c.stream, c.base + static_cast<uint64_t>(i)) >= c.p;
      mismatches += ref != static_cast<bool>(keep[i]);
      kept += keep[i];
    }
    EXPECT_EQ(mismatches, 0) << "base " << c.base << " p " << c.p;
    EXPECT_GT(kept, 0);
    EXPECT_LT(kept, n);
  }
}

INSTANTIATE_TEST_SUITE_P(Isas, SimdMath, ::testing::ValuesIn(runnable_isas()),
                         [](const ::testing::TestParamInfo<Isa>& info) { return std::string(isa_name(info.param)); });

TEST(Isa, ParseNamesAndReport) {
  EXPECT_EQ(parse_isa("AVX512", "x").value(), Isa::kAvx512);
  EXPECT_EQ(parse_isa("avx2", "x").value(), Isa::kAvx2);
  EXPECT_EQ(parse_isa("scalar", "x").value(), Isa::kScalar);
  StatusOr<Isa> bad = parse_isa("sse9", "GALE_MAX_ISA");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "GALE_MAX_ISA: expected scalar, avx2 or avx512, found 'sse9'");
  EXPECT_NE(isa_report().find(isa_name(detected_isa())), std::string::npos);
}

TEST(Isa, EnvironmentCapsButNeverRaises) {
  const Isa hw = hardware_isa();
  setenv("GALE_MAX_ISA", "scalar", 1);
  EXPECT_EQ(detected_isa(), Isa::kScalar);
  EXPECT_TRUE(validate_isa_environment().ok());
  setenv("GALE_MAX_ISA", "avx512", 1);
  EXPECT_EQ(detected_isa(), hw);
  setenv("GALE_MAX_ISA", "avx2", 1);
  EXPECT_EQ(detected_isa(), min_isa(hw, Isa::kAvx2));
  setenv("GALE_MAX_ISA", "bogus", 1);
  EXPECT_EQ(detected_isa(), hw);  // reported once on stderr, then ignored
  Status st = validate_isa_environment();
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("found 'bogus'"), std::string::npos);
  unsetenv("GALE_MAX_ISA");
  EXPECT_EQ(detected_isa(), hw);
}

TEST(Isa, FeaturesAreConsistentWithTheLevel) {
  const CpuFeatures& f = cpu_features();
  if (hardware_isa() >= Isa::kAvx2) {
    EXPECT_TRUE(f.avx2 && f.fma && f.os_ymm);
  }
  if (hardware_isa() == Isa::kAvx512) {
    EXPECT_TRUE(f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.os_zmm);
  }
  EXPECT_NE(fused_kernel_set(Isa::kScalar), nullptr);
}

}  // namespace
}  // namespace gale
