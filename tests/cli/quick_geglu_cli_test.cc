// Megatron main's gpt-oss activation flags end to end (--quick-geglu, --glu-linear-offset,
// --activation-func-clamp-value): level 0 (reference kernels) and level 2 (the fused gated kernel,
// installed by bias-gelu-fusion / use-fused-swiglu) give the same losses for a dense model, a MoE
// model with grouped-GEMM experts and a shared expert, and one with biased experts in the per-expert
// loop; the offset and the clamp change the run.
#include <gtest/gtest.h>

#include "cli/cli_test_util.h"
#include "cli/log_line.h"
#include "data/data_test_util.h"

namespace gale {
namespace {

// The clamp 0.125 binds in this model (init std 0.02, hidden 32: fc1 outputs of about ±0.1).
const std::string kGptOss = " --quick-geglu --glu-linear-offset 1.0 --activation-func-clamp-value 0.125";
const std::string kMoe =
    " --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 48 --moe-aux-loss-coeff 0.01 --moe-grouped-gemm "
    "--moe-shared-expert-intermediate-size 32 --normalization RMSNorm --disable-bias-linear";

void expect_levels_agree(const std::string& model, const char* fused_feature) {
  testing::TempDir dir;
  std::vector<std::vector<double>> losses;
  for (const char* level : {"0", "2"}) {
    testing::CommandResult r =
        testing::run_gale("pretrain " + testing::kTinyMockGpt + model + " --optimization-level " + level +
                              " --train-iters 3",
                          dir.path());
    ASSERT_EQ(r.exit_code, 0) << model << "\n" << r.err;
    if (std::string(level) == "2")
      EXPECT_NE(r.out.find(std::string("active: ") + fused_feature), std::string::npos) << r.out;
    losses.push_back(testing::logged_values(r.out, "lm loss"));
    ASSERT_EQ(losses.back().size(), 3u) << r.out;
  }
  for (size_t i = 0; i < 3; ++i)
    EXPECT_NEAR(losses[1][i], losses[0][i], 1e-5 * losses[0][i]) << model << " iteration " << i + 1;
}

TEST(QuickGegluCli, DenseModelSameLossesAtLevels0And2) { expect_levels_agree(kGptOss, "bias-gelu-fusion"); }

TEST(QuickGegluCli, MoeModelSameLossesAtLevels0And2) { expect_levels_agree(kGptOss + kMoe, "bias-gelu-fusion"); }

// The per-expert loop (no --moe-grouped-gemm) with expert biases (fc1's bias added before the clamp).
TEST(QuickGegluCli, MoeModelWithBiasesPerExpertLoopSameLossesAtLevels0And2) {
  expect_levels_agree(kGptOss + " --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 48", "bias-gelu-fusion");
}

TEST(QuickGegluCli, ClampedSwigluMoeSameLossesAtLevels0And2) {
  expect_levels_agree(" --swiglu --activation-func-clamp-value 0.125 --use-fused-swiglu" + kMoe, "use-fused-swiglu");
}

TEST(QuickGegluCli, OffsetAndClampChangeTheRun) {
  testing::TempDir dir;
  const std::vector<double> full = testing::pretrain_losses(testing::kTinyMockGpt + kGptOss, dir.path());
  const std::vector<double> no_clamp =
      testing::pretrain_losses(testing::kTinyMockGpt + " --quick-geglu --glu-linear-offset 1.0", dir.path());
  const std::vector<double> plain = testing::pretrain_losses(testing::kTinyMockGpt + " --quick-geglu", dir.path());
  ASSERT_EQ(full.size(), 3u);
  ASSERT_EQ(no_clamp.size(), 3u);
  ASSERT_EQ(plain.size(), 3u);
  EXPECT_NE(full[0], no_clamp[0]);
  EXPECT_NE(no_clamp[0], plain[0]);
}

}  // namespace
}  // namespace gale
