// `gale pretrain --dataloader-type cyclic` as a user runs it: Megatron's shuffled sample order
// changes the losses of the in-order 'single' loader, pipeline and (without data sharding) data
// parallel ranks under mpirun read the samples of one process, a stopped and resumed run continues
// exactly, and 'external' or unknown values are one-line errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>

#include <unistd.h>

#include "cli/log_line.h"
#include "cli/mpi_cli.h"
#include "subprocess.h"

namespace gale {
namespace {

using testing::regex_values;
using testing::kMpiEnv;
using testing::launch_argv;

// A tiny model with dropout on mock data: 6 iterations of 4 samples (micro-batch 2), validation
// every 3 iterations.
std::vector<std::string> tiny(int np, std::vector<std::string> extra) {
  const std::vector<std::string> pretrain = {
      GALE_BINARY, "pretrain", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
      "--seq-length", "32", "--max-position-embeddings", "32", "--attention-dropout", "0.1", "--hidden-dropout", "0.1",
      "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", "6", "--lr", "3e-3", "--mock-data",
      "--vocab-size", "4096", "--log-interval", "1", "--eval-interval", "3", "--eval-iters", "1", "--num-threads", "1",
      "--optimization-level", "0"};
  return launch_argv(np, pretrain, extra);
}

const char* kTrainLoss = R"(\| lm loss: ([0-9.E+-]+) \|)";
const char* kEvalLoss = R"(\| lm loss value: ([0-9.E+-]+) \|)";

const std::vector<std::string> kCyclic = {"--dataloader-type", "cyclic"};

TEST(GalePretrainDataloaderType, CyclicReadsAnotherOrderThanSingle) {
  test::RunResult single = test::run_with_timeout(tiny(1, {}), {}, 300);
  ASSERT_EQ(single.exit_code, 0) << single.output;
  test::RunResult explicit_single = test::run_with_timeout(tiny(1, {"--dataloader-type", "single"}), {}, 300);
  ASSERT_EQ(explicit_single.exit_code, 0) << explicit_single.output;
  test::RunResult cyclic = test::run_with_timeout(tiny(1, kCyclic), {}, 300);
  ASSERT_EQ(cyclic.exit_code, 0) << cyclic.output;
  EXPECT_EQ(regex_values(explicit_single.output, kTrainLoss), regex_values(single.output, kTrainLoss));  // the default
  const std::vector<double> a = regex_values(single.output, kTrainLoss), b = regex_values(cyclic.output, kTrainLoss);
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u) << cyclic.output;
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NE(a[i], b[i]) << "iteration " << i + 1;
  // Validation (after iterations 3 and 6, and the final one) and test read shuffled samples too.
  const std::vector<double> va = regex_values(single.output, kEvalLoss), vb = regex_values(cyclic.output, kEvalLoss);
  ASSERT_EQ(va.size(), 4u);
  ASSERT_EQ(vb.size(), 4u);
  for (size_t i = 0; i < va.size(); ++i) EXPECT_NE(va[i], vb[i]) << "evaluation " << i;
  EXPECT_EQ(regex_values(cyclic.output, R"(\| consumed samples: +(\d+) \|)"), (std::vector<double>{4, 8, 12, 16, 20, 24}));
}

void expect_same_losses(const test::RunResult& one, const test::RunResult& other) {
  for (const char* pattern : {kTrainLoss, kEvalLoss}) {
    const std::vector<double> a = regex_values(one.output, pattern), b = regex_values(other.output, pattern);
    ASSERT_EQ(a.size(), b.size()) << pattern << "\n" << other.output;
    ASSERT_GE(a.size(), 3u) << pattern;
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-5 * a[i]) << pattern << " #" << i;
  }
}

// Pipeline stages share their data-parallel rank's samples; without data sharding two data-parallel
// ranks deal out one process's shuffled global batches (Megatron's strided split), so both runs
// give one process's losses (dropout masks follow the samples). With sharding (the default) each
// DP rank shuffles its own half of the dataset, as in Megatron: other samples, other losses.
TEST(GalePretrainDataloaderType, PipelineAndDataParallelRanksReadOneProcesssSamples) {
  test::RunResult one = test::run_with_timeout(tiny(1, kCyclic), kMpiEnv, 300);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  test::RunResult pp = test::run_with_timeout(tiny(2, {"--dataloader-type", "cyclic", "--pipeline-model-parallel-size",
                                                       "2"}),
                                              kMpiEnv, 300);
  ASSERT_EQ(pp.exit_code, 0) << pp.output;
  expect_same_losses(one, pp);
  test::RunResult one_unsharded =
      test::run_with_timeout(tiny(1, {"--dataloader-type", "cyclic", "--no-data-sharding"}), kMpiEnv, 300);
  ASSERT_EQ(one_unsharded.exit_code, 0) << one_unsharded.output;
  EXPECT_EQ(regex_values(one_unsharded.output, kTrainLoss), regex_values(one.output, kTrainLoss));  // one rank: one bucket
  test::RunResult dp =
      test::run_with_timeout(tiny(2, {"--dataloader-type", "cyclic", "--no-data-sharding"}), kMpiEnv, 300);
  ASSERT_EQ(dp.exit_code, 0) << dp.output;
  expect_same_losses(one, dp);
  test::RunResult dp_sharded = test::run_with_timeout(tiny(2, kCyclic), kMpiEnv, 300);
  ASSERT_EQ(dp_sharded.exit_code, 0) << dp_sharded.output;
  EXPECT_NE(regex_values(dp_sharded.output, kTrainLoss)[0], regex_values(one.output, kTrainLoss)[0]);
}

TEST(GalePretrainDataloaderType, StopAndResumeContinuesTheShuffledOrder) {
  auto dir = std::filesystem::temp_directory_path() / ("gale_cyclic_ckpt_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  test::RunResult whole = test::run_with_timeout(tiny(1, kCyclic), {}, 300);
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  std::vector<std::string> stop = kCyclic;
  stop.insert(stop.end(), {"--save", dir.string(), "--save-interval", "4", "--exit-interval", "4"});
  test::RunResult first = test::run_with_timeout(tiny(1, stop), {}, 300);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  std::vector<std::string> resume = kCyclic;
  resume.insert(resume.end(), {"--load", dir.string()});
  test::RunResult second = test::run_with_timeout(tiny(1, resume), {}, 300);
  ASSERT_EQ(second.exit_code, 0) << second.output;
  const std::vector<double> a = regex_values(whole.output, kTrainLoss), b = regex_values(second.output, kTrainLoss);
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 2u) << second.output;
  for (size_t i = 0; i < b.size(); ++i) EXPECT_EQ(b[i], a[4 + i]) << "iteration " << 5 + i;  // printed digits equal
  // The validations after iteration 6 continue from the checkpoint's consumed validation samples;
  // the test set is read from its start.
  const std::vector<double> va = regex_values(whole.output, kEvalLoss), vb = regex_values(second.output, kEvalLoss);
  ASSERT_EQ(va.size(), 4u);
  ASSERT_EQ(vb.size(), 3u) << second.output;
  for (size_t i = 0; i < vb.size(); ++i) EXPECT_EQ(vb[i], va[1 + i]) << "evaluation " << i + 1;
  std::filesystem::remove_all(dir);
}

TEST(GalePretrainDataloaderType, ExternalAndUnknownValuesAreOneLineErrors) {
  test::RunResult external = test::run_with_timeout(tiny(1, {"--dataloader-type", "external"}), {}, 60);
  EXPECT_EQ(external.exit_code, 2) << external.output;
  EXPECT_EQ(external.output,
            "gale pretrain: error: --dataloader-type external: not supported yet (Megatron hands a user-built data "
            "loader through); accepted values: single, cyclic\n");
  test::RunResult unknown = test::run_with_timeout(tiny(1, {"--dataloader-type", "random"}), {}, 60);
  EXPECT_EQ(unknown.exit_code, 2) << unknown.output;
  EXPECT_EQ(unknown.output, "gale pretrain: error: --dataloader-type: expected single or cyclic, found 'random'\n");
}

}  // namespace
}  // namespace gale
