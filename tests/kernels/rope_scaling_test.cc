// Llama 3 RoPE scaling (--use-rope-scaling) against the inverse frequencies transformers computes
// (tools/reference/rope_scaling_reference.py), and in the cos/sin tables; position interpolation
// (--rotary-seq-len-interpolation-factor).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kernels/cpu/rope.h"

namespace gale {
namespace {

nlohmann::json reference() {
  std::ifstream in(std::string(GALE_TEST_DATA_DIR) + "/reference/rope/llama3_inv_freq.json");
  return nlohmann::json::parse(in);
}

TEST(RopeScaling, MatchesTransformersLlama3InvFreq) {
  int scaled = 0;
  const nlohmann::json ref = reference();
  for (const nlohmann::json& c : ref["cases"]) {
    const int64_t d = c["head_dim"];
    const double theta = c["rope_theta"], factor = c["factor"];
    const std::vector<double> want = c["inv_freq"], plain = c["plain_inv_freq"];
    ASSERT_EQ(static_cast<int64_t>(want.size()), d / 2);
    for (int64_t i = 0; i < d / 2; ++i) {
      const double f = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(d));
      EXPECT_NEAR(f, plain[i], 1e-6 * plain[i]) << d << " " << i;
      const double got = llama3_scaled_inv_freq(f, factor);
      EXPECT_NEAR(got, want[i], 2e-6 * want[i]) << d << " " << factor << " " << i;  // transformers: float32
      scaled += std::abs(want[i] - plain[i]) > 1e-3 * plain[i];
    }
  }
  EXPECT_GT(scaled, 20);  // the cases exercise the scaled and the interpolated bands
}

TEST(RopeScaling, TablesUseTheScaledFrequencies) {
  const RopeTables plain = make_rope_tables(9000, 16, 500000.0), scaled = make_rope_tables(9000, 16, 500000.0, 8.0);
  for (int64_t i = 0; i < 8; ++i) {
    const double f = llama3_scaled_inv_freq(std::pow(500000.0, -2.0 * static_cast<double>(i) / 16.0), 8.0);
    EXPECT_NEAR(scaled.cos[static_cast<size_t>(8999 * 8 + i)], std::cos(8999.0 * f), 1e-6) << i;
    EXPECT_NEAR(scaled.sin[static_cast<size_t>(8999 * 8 + i)], std::sin(8999.0 * f), 1e-6) << i;
  }
  EXPECT_EQ(scaled.cos[0 * 8 + 0], plain.cos[0]);  // the highest frequency is not scaled
  EXPECT_NE(scaled.cos[8999 * 8 + 7], plain.cos[8999 * 8 + 7]);
}

// --rotary-seq-len-interpolation-factor 4: position p gets the angles of position p/4 (exactly,
// where p/4 is a whole position), at every frequency, with or without Llama 3 scaling.
TEST(RopeScaling, PositionInterpolationDividesPositions) {
  for (double llama3 : {0.0, 8.0}) {
    const RopeTables plain = make_rope_tables(4096, 16, 10000.0, llama3);
    const RopeTables interp = make_rope_tables(4096, 16, 10000.0, llama3, 1.0 / 4.0);
    for (int64_t p : {0, 4, 400, 4092})
      for (int64_t i = 0; i < 8; ++i) {
        EXPECT_NEAR(interp.cos[static_cast<size_t>(p * 8 + i)], plain.cos[static_cast<size_t>(p / 4 * 8 + i)], 1e-6)
            << p << " " << i;
        EXPECT_NEAR(interp.sin[static_cast<size_t>(p * 8 + i)], plain.sin[static_cast<size_t>(p / 4 * 8 + i)], 1e-6)
            << p << " " << i;
      }
    const double f0 = 1.0;  // i = 0: inv_freq 1, never scaled by Llama 3
    EXPECT_NEAR(interp.sin[static_cast<size_t>(3 * 8)], std::sin(3.0 / 4.0 * f0), 1e-7);
  }
}

}  // namespace
}  // namespace gale
