// YaRN rotary tables (model/yarn_rope.h) against Megatron's YarnRotaryEmbedding formulas in float64
// (tools/reference/yarn_rope_reference.py), and MLA's rope_type rope, which ignores the scaling factor.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/yarn_rope.h"

namespace gale {
namespace {

constexpr int64_t kMaxPositions = 16384;

TEST(YarnRope, TablesMatchTheReference) {
  std::ifstream in(std::string(GALE_TEST_DATA_DIR) + "/reference/rope/yarn_tables.json");
  const nlohmann::json ref = nlohmann::json::parse(in);
  ASSERT_EQ(ref["cases"].size(), 4u);
  for (const nlohmann::json& c : ref["cases"]) {
    YarnConfig y;
    y.enabled = true;
    y.scaling_factor = c["scaling_factor"];
    y.original_max_positions = c["original_max_positions"];
    y.beta_fast = c["beta_fast"];
    y.beta_slow = c["beta_slow"];
    y.mscale = c["mscale"];
    y.mscale_all_dim = c["mscale_all_dim"];
    y.round_to_int = c["round_to_int"];
    const int64_t R = c["R"], half = R / 2;
    const RopeTables t = make_yarn_rope_tables(y, kMaxPositions + 1, R, c["base"].get<double>());
    ASSERT_EQ(t.rot_dim, R);
    const std::vector<int64_t> positions = c["positions"];
    for (size_t k = 0; k < positions.size(); ++k)
      for (int64_t i = 0; i < half; ++i) {
        const size_t at = static_cast<size_t>(positions[k] * half + i);
        const double want_cos = c["cos"][k][i], want_sin = c["sin"][k][i];
        // f32 tables of angles up to 16383 rad: 2e-6 relative error of the angle's float rounding.
        EXPECT_NEAR(t.cos[at], want_cos, 2e-5) << "R " << R << " position " << positions[k] << " i " << i;
        EXPECT_NEAR(t.sin[at], want_sin, 2e-5) << "R " << R << " position " << positions[k] << " i " << i;
      }
    // Position 0: cos is the concentration factor itself.
    EXPECT_NEAR(t.cos[0], c["concentration"].get<double>(), 1e-6);
  }
}

// The blend matters: the same flags with s = 1 give plain RoPE, and s = 4 moves the low frequencies
// (divided by s) but keeps the highest one (i = 0) apart from the concentration factor.
TEST(YarnRope, ScalingOneIsPlainRopeAndScalingMovesOnlyLowFrequencies) {
  YarnConfig y;
  y.enabled = true;
  const RopeTables plain = make_rope_tables(5000, 64, 10000.0), one = make_yarn_rope_tables(y, 5000, 64, 10000.0);
  EXPECT_EQ(one.cos, plain.cos);
  EXPECT_EQ(one.sin, plain.sin);
  y.scaling_factor = 4.0;
  const RopeTables four = make_yarn_rope_tables(y, 5000, 64, 10000.0);
  const double m = yarn_mscale(4.0, 1.0);  // mscale 1 over mscale_all_dim 0
  EXPECT_NEAR(four.cos[4999 * 32 + 0], m * plain.cos[4999 * 32 + 0], 1e-5);
  const double low = std::pow(10000.0, -62.0 / 64.0) / 4.0;  // i = 31: fully interpolated
  EXPECT_NEAR(four.sin[4999 * 32 + 31], m * std::sin(4999.0 * low), 1e-5);
}

TEST(YarnRope, MlaRopeTypeRopeIgnoresTheScalingFactor) {
  MlaConfig mla;
  mla.enabled = true;
  mla.qk_pos_emb_head_dim = 16;
  mla.rotary_scaling_factor = 40.0;
  mla.mscale = 1.0;
  mla.mscale_all_dim = 1.0;
  mla.yarn = false;  // --rope-type rope
  const RopeTables plain = make_rope_tables(4096, 16, 10000.0), rope = make_mla_rope_tables(mla, 4096, 10000.0);
  EXPECT_EQ(rope.cos, plain.cos);
  mla.yarn = true;
  const RopeTables yarn = make_mla_rope_tables(mla, 4096, 10000.0);
  EXPECT_NE(yarn.sin, plain.sin);
}

}  // namespace
}  // namespace gale
