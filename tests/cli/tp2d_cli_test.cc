// `mpirun -np 4 gale pretrain --tp-2d --tp-x 2 --tp-y 2 --tensor-model-parallel-size 4` as a user runs
// it: the one-process losses (GPT at level 2; LLaMA-style with bf16 and flash attention), the
// feature reported at start-up, and a refused combination's error.
#include <gtest/gtest.h>

#include <regex>

#include "cli/log_line.h"
#include "cli/mpi_cli.h"
#include "subprocess.h"

namespace gale {
namespace {

using testing::regex_values;
using testing::kMpiEnv;
using testing::launch_argv;

// A tiny GPT with dropout; 4096 tokens (--vocab-size 4095 and the end-of-document one), so the
// vocabulary pads to the same size at TP 1 and TP 4.
std::vector<std::string> tiny(int np, std::vector<std::string> extra) {
  const std::vector<std::string> pretrain = {
      GALE_BINARY, "pretrain", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
      "--attention-dropout", "0.1", "--hidden-dropout", "0.1", "--seq-length", "24", "--max-position-embeddings",
      "24", "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", "4", "--lr", "3e-3",
      "--mock-data", "--vocab-size", "4095", "--make-vocab-size-divisible-by", "1", "--log-interval", "1",
      "--eval-interval", "2", "--eval-iters", "1", "--num-threads", "1"};
  return launch_argv(np, pretrain, extra);
}

const std::vector<std::string> k2x2 = {"--tp-2d", "--tp-x", "2", "--tp-y", "2", "--tensor-model-parallel-size", "4"};

// `flags` on one process and on a 2x2 grid of 4: the same training and validation losses.
void expect_same_losses(const std::vector<std::string>& flags, double tolerance) {
  test::RunResult one = test::run_with_timeout(tiny(1, flags), kMpiEnv, 300);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  std::vector<std::string> grid_flags = flags;
  grid_flags.insert(grid_flags.end(), k2x2.begin(), k2x2.end());
  test::RunResult grid = test::run_with_timeout(tiny(4, grid_flags), kMpiEnv, 300);
  ASSERT_EQ(grid.exit_code, 0) << grid.output;
  EXPECT_NE(grid.output.find("active: tp-2d (parallel, level 0)"), std::string::npos) << grid.output;
  for (const char* pattern : {R"(\| lm loss: ([0-9.E+-]+) \|)", R"(\| lm loss value: ([0-9.E+-]+) \|)"}) {
    const std::vector<double> a = regex_values(one.output, pattern), b = regex_values(grid.output, pattern);
    ASSERT_EQ(a.size(), b.size()) << pattern << "\n" << grid.output;
    ASSERT_GE(a.size(), 2u) << pattern << "\n" << one.output;
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], tolerance * a[i]) << pattern << " #" << i;
  }
}

// The default level 2 (the fused and vectorised kernels must honour the pieces' dropout columns).
TEST(GalePretrainTp2d, TwoByTwoSameLossesAsOneProcess) { expect_same_losses({}, 1e-5); }

// A LLaMA-style model with bf16 GEMMs (of other shapes) and the flash kernel: a looser bound.
TEST(GalePretrainTp2d, TwoByTwoBf16FlashLlamaAsOneProcess) {
  expect_same_losses({"--bf16", "--use-flash-attn", "--swiglu", "--normalization", "RMSNorm",
                      "--position-embedding-type", "rope"},
                     1e-4);
}

// Megatron's --window-size with --window-attn-skip-freq: the 2-D TP layer's attention takes each
// layer's own window (the first layer sees the query and 5 keys back, the second every key).
TEST(GalePretrainTp2d, TwoByTwoPerLayerWindowsAsOneProcess) {
  expect_same_losses({"--window-size", "5,0", "--window-attn-skip-freq", "2"}, 1e-5);
}

TEST(GalePretrainTp2d, SequenceParallelIsRefused) {
  std::vector<std::string> flags = k2x2;
  flags.push_back("--sequence-parallel");
  test::RunResult r = test::run_with_timeout(tiny(4, flags), kMpiEnv, 120);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("gale pretrain: error: --tp-2d does not support --sequence-parallel (2-D TP splits the "
                          "sequence itself; as MindSpeed)"),
            std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace gale
