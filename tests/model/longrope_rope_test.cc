// LongRoPE (model/longrope_rope.h): the tables against a float64 restatement of transformers' and
// MindSpeed-LLM's formulas (tools/reference/longrope_rope_reference.py), the short / long choice of each
// forward, finite differences of a LongRoPE model, and the fused RoPE kernel on its tables.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "kernels/cpu/fused_ops.h"
#include "model/gpt_model.h"
#include "model/longrope_rope.h"
#include "model_test_batches.h"
#include "testing.h"

namespace gale {
namespace {

LongRopeConfig longrope_of(const nlohmann::json& c) {
  LongRopeConfig lr;
  lr.enabled = true;
  lr.original_max_positions = c["original"];
  lr.short_factor = c["short_factor"].get<std::vector<double>>();
  lr.long_factor = c["long_factor"].get<std::vector<double>>();
  lr.short_mscale = c["short_mscale"];
  lr.long_mscale = c["long_mscale"];
  return lr;
}

TEST(LongRope, TablesMatchTheReference) {
  std::ifstream in(std::string(GALE_TEST_DATA_DIR) + "/reference/rope/longrope_tables.json");
  const nlohmann::json ref = nlohmann::json::parse(in);
  ASSERT_EQ(ref["cases"].size(), 4u);
  for (const nlohmann::json& c : ref["cases"]) {
    const int64_t R = c["R"], half = R / 2, max_positions = c["max_positions"], original = c["original"];
    EXPECT_DOUBLE_EQ(longrope_default_mscale(max_positions, original), c["default_mscale"].get<double>());
    const LongRopeConfig lr = longrope_of(c);
    for (const bool use_long : {false, true}) {
      // One row more: the cases read position `original`, which is max_positions itself in one of them.
      const RopeTables t = make_longrope_tables(lr, use_long, max_positions + 1, R, c["base"].get<double>());
      ASSERT_EQ(t.rot_dim, R);
      ASSERT_EQ(t.max_positions, max_positions + 1);
      const std::vector<int64_t> positions = c["positions"];
      const nlohmann::json& want_cos = c[use_long ? "long_cos" : "short_cos"];
      const nlohmann::json& want_sin = c[use_long ? "long_sin" : "short_sin"];
      for (size_t k = 0; k < positions.size(); ++k)
        for (int64_t i = 0; i < half; ++i) {
          const size_t at = static_cast<size_t>(positions[k] * half + i);
          // f32 tables of float64 values (angles up to 131071 rad stay exact in double).
          EXPECT_NEAR(t.cos[at], want_cos[k][i].get<double>(), 2e-6) << R << " long " << use_long << " p " << positions[k];
          EXPECT_NEAR(t.sin[at], want_sin[k][i].get<double>(), 2e-6) << R << " long " << use_long << " p " << positions[k];
        }
    }
  }
}

// Factors of 1 and mscale 1 are plain RoPE; the long table of other factors is not the short one.
TEST(LongRope, UnitFactorsArePlainRope) {
  LongRopeConfig lr;
  lr.enabled = true;
  lr.original_max_positions = 8;
  lr.short_factor.assign(8, 1.0);
  lr.long_factor = {1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0};
  const RopeTables plain = make_rope_tables(64, 16, 10000.0), unit = make_longrope_tables(lr, false, 64, 16, 10000.0);
  for (size_t i = 0; i < plain.cos.size(); ++i) {
    ASSERT_NEAR(unit.cos[i], plain.cos[i], 1e-6) << i;
    ASSERT_NEAR(unit.sin[i], plain.sin[i], 1e-6) << i;
  }
  const RopeTables longer = make_longrope_tables(lr, true, 64, 16, 10000.0);
  EXPECT_EQ(longer.cos[63 * 8], plain.cos[63 * 8]);  // factor 1: pair 0 unchanged
  EXPECT_NEAR(longer.sin[63 * 8 + 7], std::sin(63.0 / (12.0 * std::pow(10000.0, 14.0 / 16.0))), 1e-6);
}

// By length (Hugging Face's rule): the largest position + 1 against the original context, whatever the
// order; otherwise the --seq-length choice fixed at set-up (MindSpeed-LLM's).
TEST(LongRope, ChoiceOfTheLongTable) {
  LongRopeConfig lr;
  lr.original_max_positions = 8;
  const std::vector<int32_t> eight = {7, 0, 1, 2, 3, 4, 5, 6}, nine = {3, 8, 1};
  EXPECT_FALSE(longrope_use_long(lr, true, eight.data(), 8));
  EXPECT_TRUE(longrope_use_long(lr, true, nine.data(), 3));
  EXPECT_FALSE(longrope_use_long(lr, false, nine.data(), 3));
  lr.long_without_cache = true;
  EXPECT_TRUE(longrope_use_long(lr, false, eight.data(), 8));
}

// The gradcheck GPT (head dim 8: 4 rotary pairs) with RoPE under LongRoPE's tables.
ModelConfig longrope_config(bool use_long) {
  ModelConfig c = testing::gradcheck_gpt_config();
  c.position = PositionEmbedding::kRope;
  c.longrope.enabled = true;
  c.longrope.original_max_positions = 4;
  c.longrope.short_factor = {1.0, 1.3, 1.7, 2.2};
  c.longrope.long_factor = {1.1, 2.5, 6.0, 15.0};
  c.longrope.short_mscale = c.longrope.long_mscale = longrope_default_mscale(c.max_positions, 4);
  c.longrope.long_without_cache = use_long;
  return c;
}

TEST(LongRope, EveryParameterMatchesFiniteDifferences) {
  testing::expect_every_parameter_matches_finite_differences(longrope_config(true));
  testing::expect_every_parameter_matches_finite_differences(longrope_config(false));
}

double loss_of(const ModelConfig& c, const OpTable& ops, std::vector<float>* grads) {
  GPTModel model(c, single_process_partition(c), &ops);
  model.params().initialize(42);
  const double loss = testing::mean_loss(model, testing::masked_batch(c, 2, 7, false), grads != nullptr);
  if (grads) grads->assign(model.params().flat_grads().data<float>(),
                           model.params().flat_grads().data<float>() + model.params().numel());
  return loss;
}

// The training forward uses the table --seq-length picks: the long one changes the loss, and a long table
// equal to the short one gives the short table's loss exactly.
TEST(LongRope, TrainingForwardUsesTheSeqLengthChoice) {
  const OpTable ops = reference_ops();
  const double short_loss = loss_of(longrope_config(false), ops, nullptr);
  const double long_loss = loss_of(longrope_config(true), ops, nullptr);
  EXPECT_GT(std::abs(long_loss - short_loss), 1e-4);
  ModelConfig same = longrope_config(true);
  same.longrope.long_factor = same.longrope.short_factor;
  EXPECT_EQ(loss_of(same, ops, nullptr), short_loss);
}

// --use-fused-rotary-pos-emb reads the same tables: loss and gradients as the reference kernels.
TEST(LongRope, FusedKernelsMatchTheReference) {
  const OpTable ref = reference_ops();
  OpTable fused = reference_ops();
  ASSERT_TRUE(install_all_fused_kernels(fused, detected_isa()).ok());
  for (const bool use_long : {false, true}) {
    std::vector<float> g_ref, g_fused;
    const double a = loss_of(longrope_config(use_long), ref, &g_ref), b = loss_of(longrope_config(use_long), fused, &g_fused);
    EXPECT_NEAR(b, a, 1e-6 * std::abs(a));
    ASSERT_EQ(g_ref.size(), g_fused.size());
    double peak = 0, diff = 0;
    for (size_t i = 0; i < g_ref.size(); ++i) {
      peak = std::max(peak, static_cast<double>(std::abs(g_ref[i])));
      diff = std::max(diff, static_cast<double>(std::abs(g_ref[i] - g_fused[i])));
    }
    EXPECT_LT(diff, 5e-6 * peak) << "long " << use_long;
  }
}

}  // namespace
}  // namespace gale
