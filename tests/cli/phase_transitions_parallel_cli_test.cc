// `gale pretrain --phase-transition-iterations` under mpirun: the second phase, resumed on another
// corpus from the first phase's single-process checkpoint, logs the single-process losses at data
// parallel size 2 and at pipeline parallel size 2 (each data-parallel rank reads its part of the
// phase's samples from the phase's sample 0).
#include <gtest/gtest.h>

#include <random>

#include "cli/log_line.h"
#include "cli/mpi_cli.h"
#include "data/data_test_util.h"
#include "subprocess.h"

namespace gale {
namespace {

using testing::kMpiEnv;
using testing::launch_argv;
using testing::logged_values;

void write_corpus(const std::string& prefix, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int32_t>> docs(8);
  for (auto& d : docs) {
    d.resize(20);
    for (int32_t& t : d) t = static_cast<int32_t>(rng() % 99);
  }
  testing::write_dataset(prefix, docs);
}

// Transitions at iteration 2 of 4 (4 samples per iteration, micro-batches of 1).
std::vector<std::string> phase_run(int np, const std::string& data, std::vector<std::string> extra) {
  const std::vector<std::string> pretrain = {
      GALE_BINARY, "pretrain", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
      "--seq-length", "32", "--max-position-embeddings", "32", "--tokenizer-type", "NullTokenizer", "--vocab-size",
      "128", "--micro-batch-size", "1", "--global-batch-size", "4", "--lr", "3e-3", "--lr-decay-style", "constant",
      "--eval-iters", "0", "--num-threads", "1", "--log-interval", "1", "--split", "100,0,0", "--seed", "7",
      "--train-samples", "16", "--phase-transition-iterations", "2", "--save-interval", "100", "--data-path", data};
  return launch_argv(np, pretrain, extra);
}

TEST(PhaseTransitionsParallelCli, SecondPhaseAtDataAndPipelineParallelSize2) {
  testing::TempDir dir;
  const std::string a = dir.file("corpus_a"), b = dir.file("corpus_b"), ckpt = dir.file("ckpt");
  write_corpus(a, 1);
  write_corpus(b, 2);
  test::RunResult first = test::run_with_timeout(phase_run(1, a, {"--save", ckpt}), kMpiEnv, 300);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  ASSERT_NE(first.output.find("exiting program at iteration 2"), std::string::npos) << first.output;
  test::RunResult one =
      test::run_with_timeout(phase_run(1, b, {"--load", ckpt, "--save", dir.file("one")}), kMpiEnv, 300);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const std::vector<double> loss = logged_values(one.output, "lm loss");
  ASSERT_EQ(loss.size(), 2u) << one.output;
  for (const std::vector<std::string>& layout : {std::vector<std::string>{},
                                                 std::vector<std::string>{"--pipeline-model-parallel-size", "2"}}) {
    std::vector<std::string> extra = {"--load", ckpt, "--save", dir.file(layout.empty() ? "dp" : "pp")};
    extra.insert(extra.end(), layout.begin(), layout.end());
    test::RunResult two = test::run_with_timeout(phase_run(2, b, extra), kMpiEnv, 300);
    ASSERT_EQ(two.exit_code, 0) << two.output;
    EXPECT_NE(two.output.find("this phase starts at iteration 2; its training dataset holds 8 samples, read from "
                              "sample 0"),
              std::string::npos)
        << two.output;
    const std::vector<double> l = logged_values(two.output, "lm loss");
    ASSERT_EQ(l.size(), loss.size()) << two.output;
    for (size_t i = 0; i < l.size(); ++i) EXPECT_NEAR(l[i], loss[i], 1e-5 * loss[i]) << layout.size() << " #" << i;
  }
}

}  // namespace
}  // namespace gale
