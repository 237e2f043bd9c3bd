// MindSpeed-LLM's GeGLU end to end (Gemma's MLP: --gelu-tanh, and the exact --geglu): level 0 (reference
// kernels) and level 2 with --use-fused-swiglu (the fused GeGLU kernels, kernels/cpu/fused_geglu.h) give
// the same losses, within the tolerance of the fused SwiGLU's check (tests/cli/quick_geglu_cli_test.cc),
// for a dense Gemma-style model, a MoE model with grouped-GEMM experts and a shared expert, and biased
// experts in the per-expert loop; the fused kernels are really installed at level 2.
#include <gtest/gtest.h>

#include "cli/cli_test_util.h"
#include "cli/log_line.h"
#include "data/data_test_util.h"

namespace gale {
namespace {

const std::string kGemma = " --gelu-tanh --normalization RMSNorm --add-rmsnorm-offset --input-embeds-norm";
const std::string kMoe =
    " --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 48 --moe-aux-loss-coeff 0.01 --moe-grouped-gemm "
    "--moe-shared-expert-intermediate-size 32 --disable-bias-linear";

// The losses of 3 iterations at `level` (level 2 adds --use-fused-swiglu), and the run's stdout. The
// initialisation's std 0.2 (not 0.02) puts the gates at O(1), where GeLU is far from linear: there the
// exact and the tanh GeLU give different losses (TanhAndExactGatesDiffer).
std::vector<double> losses_at(const std::string& model, const char* level, const std::string& dir, std::string* out) {
  const std::string fused = std::string(level) == "2" ? " --use-fused-swiglu" : "";
  testing::CommandResult r =
      testing::run_gale("pretrain " + testing::kTinyMockGpt + " --init-method-std 0.2" + model + fused +
                            " --optimization-level " + level + " --train-iters 3",
                        dir);
  EXPECT_EQ(r.exit_code, 0) << model << "\n" << r.err;
  *out = r.out;
  return testing::logged_values(r.out, "lm loss");
}

void expect_levels_agree(const std::string& model) {
  testing::TempDir dir;
  std::string out0, out2;
  const std::vector<double> l0 = losses_at(model, "0", dir.path(), &out0);
  const std::vector<double> l2 = losses_at(model, "2", dir.path(), &out2);
  EXPECT_NE(out2.find("active: use-fused-swiglu"), std::string::npos) << out2;
  EXPECT_NE(out2.find("geglu=fused-"), std::string::npos) << out2;  // the start-up report's kernels line
  EXPECT_NE(out0.find("geglu=reference"), std::string::npos) << out0;
  ASSERT_EQ(l0.size(), 3u) << out0;
  ASSERT_EQ(l2.size(), 3u) << out2;
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(l2[i], l0[i], 1e-5 * l0[i]) << model << " iteration " << i + 1;
}

TEST(GegluCli, GemmaDenseModelSameLossesAtLevels0And2) { expect_levels_agree(kGemma); }

TEST(GegluCli, ExactGegluDenseModelSameLossesAtLevels0And2) {
  expect_levels_agree(" --geglu --normalization RMSNorm");
}

TEST(GegluCli, GemmaMoeModelSameLossesAtLevels0And2) { expect_levels_agree(kGemma + kMoe); }

// The per-expert loop (no --moe-grouped-gemm) with expert biases (fc1's bias added inside the kernel).
TEST(GegluCli, MoeModelWithBiasesPerExpertLoopSameLossesAtLevels0And2) {
  expect_levels_agree(" --gelu-tanh --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 48");
}

// The two GeLU forms are different models, and the fused tanh form is not the exact one.
TEST(GegluCli, TanhAndExactGatesDiffer) {
  testing::TempDir dir;
  std::string out;
  const std::vector<double> tanh2 = losses_at(" --gelu-tanh", "2", dir.path(), &out);
  const std::vector<double> erf2 = losses_at(" --geglu", "2", dir.path(), &out);
  ASSERT_EQ(tanh2.size(), 3u);
  ASSERT_EQ(erf2.size(), 3u);
  EXPECT_NE(tanh2[2], erf2[2]);
}

}  // namespace
}  // namespace gale
