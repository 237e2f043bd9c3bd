// `gale pretrain --rampup-batch-size` as a user runs it: the log lines' growing global batch size
// and consumed samples, Megatron's checkpoint before a batch-size step, resuming in the middle of
// the ramp-up with the same losses, the same losses on two data-parallel ranks, the per-step
// divisibility error, and --decrease-batch-size-if-needed.
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

// A tiny model with dropout, 24 samples, micro-batch 1, ramping 2 -> 4 by 1 over 8 samples: two
// increments of 4 samples. Iterations (consumed before -> global batch size): 0 -> 2, 2 -> 2,
// 4 -> 3, 7 -> 3, 10 -> 4 (10 > 8), 14 -> 4, 18 -> 4; update_train_iters: 4 ramp-up iterations
// reach 10 samples, then (24 - 10) // 4 = 3 more: 7 iterations, 22 samples.
std::vector<std::string> tiny(int np, std::vector<std::string> extra) {
  const std::vector<std::string> pretrain = {
      GALE_BINARY, "pretrain", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
      "--seq-length", "32", "--max-position-embeddings", "32", "--attention-dropout", "0.1", "--hidden-dropout", "0.1",
      "--lr", "3e-3", "--lr-warmup-samples", "4", "--lr-decay-style", "cosine", "--mock-data", "--vocab-size", "4096",
      "--log-interval", "1", "--eval-interval", "3", "--eval-iters", "1", "--num-threads", "1"};
  return launch_argv(np, pretrain, extra);
}

const std::vector<std::string> kRamp = {"--micro-batch-size", "1", "--global-batch-size", "4", "--train-samples",
                                        "24", "--rampup-batch-size", "2", "1", "8"};

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::vector<double> losses(const std::string& output) { return regex_values(output, R"(\| lm loss: ([0-9.E+-]+) \|)"); }

TEST(GalePretrainRampup, LogLinesShowTheGrowingBatchSize) {
  test::RunResult r = test::run_with_timeout(tiny(1, kRamp), {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("will use batch size rampup starting from global batch size 2 to global batch size 4 with "
                          "batch size increments 1 over 8 samples."),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("setting training iterations to 7"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("ramping up batch size from 2 to 3"), std::string::npos);
  EXPECT_NE(r.output.find("ramping up batch size from 3 to 4"), std::string::npos);
  const std::vector<double> iteration = regex_values(r.output, R"(\] iteration +(\d+)/ +7 \|)");
  const std::vector<double> consumed = regex_values(r.output, R"(\| consumed samples: +(\d+) \|)");
  const std::vector<double> batch = regex_values(r.output, R"(\| global batch size: +(\d+) \|)");
  EXPECT_EQ(iteration, (std::vector<double>{1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(consumed, (std::vector<double>{2, 4, 7, 10, 14, 18, 22}));
  EXPECT_EQ(batch, (std::vector<double>{2, 2, 3, 3, 4, 4, 4}));
  EXPECT_EQ(losses(r.output).size(), 7u);
}

// Megatron saves before the first iteration of a new batch size (here before iterations 3 and 5);
// a run resumed from iteration 3 (7 samples, mid-ramp) continues at batch size 3, then 4, with
// exactly the uninterrupted run's samples and losses.
TEST(GalePretrainRampup, ResumesInTheMiddleOfTheRampUp) {
  auto dir = std::filesystem::temp_directory_path() / ("gale_rampup_ckpt_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  test::RunResult whole = test::run_with_timeout(tiny(1, kRamp), {}, 300);
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  test::RunResult first = test::run_with_timeout(
      tiny(1, with(kRamp, {"--save", dir.string(), "--save-interval", "100", "--exit-interval", "3"})), {}, 300);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_TRUE(std::filesystem::exists(dir / "iter_0000002")) << "no checkpoint before the batch-size step";
  EXPECT_TRUE(std::filesystem::exists(dir / "iter_0000003"));
  EXPECT_FALSE(std::filesystem::exists(dir / "iter_0000001"));
  test::RunResult second = test::run_with_timeout(tiny(1, with(kRamp, {"--load", dir.string()})), {}, 300);
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_EQ(regex_values(second.output, R"(\| consumed samples: +(\d+) \|)"), (std::vector<double>{10, 14, 18, 22}));
  EXPECT_EQ(regex_values(second.output, R"(\| global batch size: +(\d+) \|)"), (std::vector<double>{3, 4, 4, 4}));
  const std::vector<double> a = losses(whole.output), b = losses(second.output);
  ASSERT_EQ(a.size(), 7u);
  ASSERT_EQ(b.size(), 4u) << second.output;
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(b[i], a[3 + i]) << "iteration " << 4 + i;  // printed digits equal
  std::filesystem::remove_all(dir);
}

// Two data-parallel ranks: 2 -> 6 by 2 over 8 samples gives batches 2, 2, 4, 6, 6, 6 (at 8 consumed
// samples int(8 / 4.0) = 2 increments), i.e. 1, 1, 2, 3, 3, 3 micro-batches per rank, drawing
// Megatron's samples: the same losses as one process.
TEST(GalePretrainRampup, DataParallelRanksDrawTheSameSamples) {
  const std::vector<std::string> ramp = {"--micro-batch-size", "1", "--global-batch-size", "6", "--train-samples",
                                         "26", "--rampup-batch-size", "2", "2", "8", "--optimization-level", "0"};
  test::RunResult one = test::run_with_timeout(tiny(1, ramp), kMpiEnv, 300);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  test::RunResult dp = test::run_with_timeout(tiny(2, ramp), kMpiEnv, 300);
  ASSERT_EQ(dp.exit_code, 0) << dp.output;
  EXPECT_EQ(regex_values(dp.output, R"(\| global batch size: +(\d+) \|)"), (std::vector<double>{2, 2, 4, 6, 6, 6}));
  EXPECT_EQ(regex_values(dp.output, R"(\| consumed samples: +(\d+) \|)"), (std::vector<double>{2, 4, 8, 14, 20, 26}));
  for (const char* pattern : {R"(\| lm loss: ([0-9.E+-]+) \|)", R"(\| lm loss value: ([0-9.E+-]+) \|)"}) {
    const std::vector<double> a = regex_values(one.output, pattern), b = regex_values(dp.output, pattern);
    ASSERT_EQ(a.size(), b.size()) << pattern << "\n" << dp.output;
    ASSERT_GE(a.size(), 3u) << pattern;
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-5 * a[i]) << pattern << " #" << i;
  }
}

// Megatron checks at every step that the current global batch size divides into micro-batches:
// with micro-batch size 2 the ramp-up's 3 fails at iteration 3 (after 4 samples).
TEST(GalePretrainRampup, IndivisibleBatchSizeFailsAtItsStep) {
  const std::vector<std::string> ramp = {"--micro-batch-size", "2", "--global-batch-size", "4", "--train-samples",
                                         "24", "--rampup-batch-size", "2", "1", "8"};
  test::RunResult r = test::run_with_timeout(tiny(1, ramp), {}, 300);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("gale pretrain: error: --rampup-batch-size: the global batch size 3 after 4 consumed "
                          "samples is not divisible by --micro-batch-size 2 times the data-parallel size 1"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(losses(r.output).size(), 2u);  // iterations 1 and 2 ran
}

// A global batch of 6 with micro-batch 4 runs 4 samples per iteration and skips 2: the same run as
// --global-batch-size 4 (constant learning rate: Megatron's decay counts nominal samples), with
// Megatron's start-up line, "skipped samples" in the log line, and both counters kept on resume.
TEST(GalePretrainRampup, DecreaseBatchSizeIfNeededRunsTheRoundedBatch) {
  const std::vector<std::string> common = {"--micro-batch-size", "4", "--train-iters", "4", "--lr-decay-style",
                                           "constant", "--lr-warmup-samples", "0"};
  auto iters = [&](std::vector<std::string> extra) {
    std::vector<std::string> argv = with(tiny(1, common), extra);
    for (size_t i = 0; i < argv.size(); ++i)  // --train-iters runs: no warm-up in samples
      if (argv[i] == "--lr-warmup-samples" && argv[i + 1] == "4") argv.erase(argv.begin() + i, argv.begin() + i + 2);
    return test::run_with_timeout(argv, {}, 300);
  };
  test::RunResult four = iters({"--global-batch-size", "4"});
  ASSERT_EQ(four.exit_code, 0) << four.output;
  test::RunResult six = iters({"--global-batch-size", "6", "--decrease-batch-size-if-needed"});
  ASSERT_EQ(six.exit_code, 0) << six.output;
  EXPECT_NE(six.output.find("decreasing batch size from 6 to 4 to keep divisibility by micro_batch_size=4 * "
                            "data_parallel_size=1"),
            std::string::npos)
      << six.output;
  EXPECT_EQ(losses(six.output), losses(four.output));
  ASSERT_EQ(losses(six.output).size(), 4u);
  EXPECT_EQ(regex_values(six.output, R"(\| consumed samples: +(\d+) \|)"), (std::vector<double>{4, 8, 12, 16}));
  EXPECT_EQ(regex_values(six.output, R"(\| skipped samples: +(\d+) \|)"), (std::vector<double>{2, 4, 6, 8}));
  EXPECT_EQ(regex_values(six.output, R"(\| global batch size: +(\d+) \|)"), (std::vector<double>{4, 4, 4, 4}));
  EXPECT_EQ(regex_values(four.output, R"(\| skipped samples: +(\d+) \|)").size(), 0u);
  test::RunResult refused = iters({"--global-batch-size", "6"});
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  // Resume after iteration 2: the counters continue.
  const std::string dir = std::filesystem::temp_directory_path() / ("gale_decrease_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  test::RunResult first = iters({"--global-batch-size", "6", "--decrease-batch-size-if-needed", "--save", dir,
                                 "--save-interval", "2", "--exit-interval", "2"});
  ASSERT_EQ(first.exit_code, 0) << first.output;
  test::RunResult second = iters({"--global-batch-size", "6", "--decrease-batch-size-if-needed", "--load", dir});
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_EQ(regex_values(second.output, R"(\| skipped samples: +(\d+) \|)"), (std::vector<double>{6, 8}));
  EXPECT_EQ(regex_values(second.output, R"(\| consumed samples: +(\d+) \|)"), (std::vector<double>{12, 16}));
  const std::vector<double> all = losses(six.output), resumed = losses(second.output);
  EXPECT_EQ(resumed, std::vector<double>(all.begin() + 2, all.end()));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace gale
