// `mpirun -np 3 gale pretrain --unaligned-linear --tensor-model-parallel-size 3` as a user runs it:
// 4 heads (2, 1, 1 per rank) and FFN 256 (86, 85, 85) give the one-process losses, the feature is
// reported at start-up, and without the flag the divisibility error names it.
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

// A tiny GPT with dropout; 4098 tokens (--vocab-size 4097 and the end-of-document one), so the
// vocabulary pads to the same size at TP 1 and TP 3.
std::vector<std::string> tiny(int np, std::vector<std::string> extra) {
  const std::vector<std::string> pretrain = {
      GALE_BINARY, "pretrain", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
      "--attention-dropout", "0.1", "--hidden-dropout", "0.1", "--seq-length", "24", "--max-position-embeddings",
      "24", "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", "4", "--lr", "3e-3",
      "--mock-data", "--vocab-size", "4097", "--make-vocab-size-divisible-by", "1", "--log-interval", "1",
      "--eval-interval", "2", "--eval-iters", "1", "--num-threads", "1"};
  return launch_argv(np, pretrain, extra);
}

void expect_same_losses(const std::vector<std::string>& flags, double tolerance) {
  test::RunResult one = test::run_with_timeout(tiny(1, flags), kMpiEnv, 300);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  std::vector<std::string> tp_flags = flags;
  tp_flags.insert(tp_flags.end(), {"--unaligned-linear", "--tensor-model-parallel-size", "3"});
  test::RunResult tp = test::run_with_timeout(tiny(3, tp_flags), kMpiEnv, 300);
  ASSERT_EQ(tp.exit_code, 0) << tp.output;
  EXPECT_NE(tp.output.find("active: unaligned-linear (parallel, level 0)"), std::string::npos) << tp.output;
  for (const char* pattern : {R"(\| lm loss: ([0-9.E+-]+) \|)", R"(\| lm loss value: ([0-9.E+-]+) \|)"}) {
    const std::vector<double> a = regex_values(one.output, pattern), b = regex_values(tp.output, pattern);
    ASSERT_EQ(a.size(), b.size()) << pattern << "\n" << tp.output;
    ASSERT_GE(a.size(), 2u) << pattern << "\n" << one.output;
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], tolerance * a[i]) << pattern << " #" << i;
  }
}

TEST(GalePretrainUnalignedLinear, Tp3SameLossesAsOneProcess) {
  expect_same_losses({"--optimization-level", "0"}, 1e-5);
}

// bf16 GEMMs of other shapes and the level-2 flash kernel: a looser bound, as the CP CLI test.
TEST(GalePretrainUnalignedLinear, Tp3Bf16FlashSequenceParallelAsOneProcess) {
  expect_same_losses({"--bf16", "--use-flash-attn", "--sequence-parallel"}, 1e-4);
}

TEST(GalePretrainUnalignedLinear, WithoutTheFlagTheErrorNamesIt) {
  test::RunResult r = test::run_with_timeout(tiny(3, {"--tensor-model-parallel-size", "3"}), kMpiEnv, 120);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("gale pretrain: error: --num-attention-heads 4 must be divisible by "
                          "--tensor-model-parallel-size 3 (or give --unaligned-linear)"),
            std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace gale
