// `gale pretrain --tensorboard-dir`: Megatron's tags, steps and flags in the event file, the
// values the log line prints, the last rank as the only writer, and a bad directory as a start-up
// error.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>

#include "cli/cli_test_util.h"
#include "cli/log_line.h"
#include "cli/mpi_cli.h"
#include "subprocess.h"
#include "testing_tensorboard.h"

namespace gale {
namespace {

namespace fs = std::filesystem;
using testing::TbEvent;

using testing::kMpiEnv;
using testing::launch_argv;

// A tiny GPT for 4 iterations of 4 samples, validation every 2 iterations.
std::vector<std::string> tiny(int np, const std::string& tb_dir, std::vector<std::string> extra) {
  const std::vector<std::string> pretrain = {
      GALE_BINARY, "pretrain", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
      "--seq-length", "32", "--max-position-embeddings", "32", "--micro-batch-size", "2", "--global-batch-size", "4",
      "--train-iters", "4", "--lr", "3e-3", "--mock-data", "--vocab-size", "4096", "--log-interval", "1",
      "--eval-interval", "2", "--eval-iters", "1", "--num-threads", "1", "--tensorboard-dir", tb_dir};
  return launch_argv(np, pretrain, extra);
}

std::string fresh_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + name;
  fs::remove_all(dir);
  return dir;
}

// (tag, step) of every event, in file order.
std::vector<std::pair<std::string, int64_t>> tags_and_steps(const std::vector<TbEvent>& events) {
  std::vector<std::pair<std::string, int64_t>> out;
  for (const TbEvent& e : events) out.emplace_back(e.tag, e.step);
  return out;
}

std::vector<float> values_of(const std::vector<TbEvent>& events, const std::string& tag) {
  std::vector<float> out;
  for (const TbEvent& e : events)
    if (e.tag == tag) out.push_back(e.value);
  return out;
}

TEST(GaleTensorBoard, WritesMegatronsTagsStepsAndTheLoggedLosses) {
  const std::string dir = fresh_dir("gale_tb_cli_default") + "/tb";
  test::RunResult r = test::run_with_timeout(tiny(1, dir, {"--log-validation-ppl-to-tensorboard"}), {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("> setting tensorboard ..."), std::string::npos);
  const std::vector<TbEvent> events = testing::read_scalar_events(dir);
  // Megatron's order: each value at the iteration, then the same value at the consumed samples
  // (4 per iteration).
  std::vector<std::pair<std::string, int64_t>> expected;
  auto pair = [&](const std::string& tag, int64_t it) {
    expected.emplace_back(tag, it);
    expected.emplace_back(tag + " vs samples", 4 * it);
  };
  auto validation = [&](int64_t it) {
    pair("lm loss validation", it);
    pair("lm loss validation ppl", it);
  };
  for (int64_t it = 1; it <= 4; ++it) {
    for (const char* tag : {"learning-rate", "lm loss", "loss-scale", "grad-norm"}) pair(tag, it);
    if (it % 2 == 0) validation(it);
  }
  validation(4);  // the final validation, then the test set under the same tags (as Megatron)
  validation(4);
  EXPECT_EQ(tags_and_steps(events), expected);

  // 'lm loss' is this iteration's loss: with --log-interval 1, the log line's.
  const std::vector<double> logged = testing::logged_values(r.output, "lm loss");
  const std::vector<float> written = values_of(events, "lm loss");
  ASSERT_EQ(logged.size(), 4u);
  ASSERT_EQ(written.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(written[i], logged[i], 1e-6 * logged[i]) << "iteration " << i + 1;
  EXPECT_EQ(values_of(events, "lm loss vs samples"), written);
  const std::vector<double> lr = testing::logged_values(r.output, "learning rate");
  const std::vector<float> lr_written = values_of(events, "learning-rate");
  ASSERT_EQ(lr_written.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(lr_written[i], lr[i], 1e-6 * lr[i]);
  for (float v : values_of(events, "loss-scale")) EXPECT_EQ(v, 1.0f);
  // Validation: the printed value and its perplexity.
  std::regex block(R"(validation loss at iteration 2 \| lm loss value: ([0-9.E+-]+) \| lm loss PPL: ([0-9.E+-]+) \|)");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, block)) << r.output;
  const std::vector<float> valid = values_of(events, "lm loss validation");
  const std::vector<float> ppl = values_of(events, "lm loss validation ppl");
  ASSERT_EQ(valid.size(), 4u);
  EXPECT_NEAR(valid[0], std::stod(m[1]), 1e-6 * std::stod(m[1]));
  EXPECT_NEAR(ppl[0], std::stod(m[2]), 1e-6 * std::stod(m[2]));
  EXPECT_NEAR(ppl[0], std::exp(valid[0]), 1e-5 * ppl[0]);
}

// --decoupled-lr: Megatron main's training_log writes no 'decoupled-learning-rate' and prints no
// "decoupled learning rate" (its optimizer refactor dropped both): the learning rate's pair, then
// the loss.
TEST(GaleTensorBoard, NoDecoupledLearningRate) {
  const std::string dir = fresh_dir("gale_tb_cli_decoupled") + "/tb";
  test::RunResult r = test::run_with_timeout(tiny(1, dir, {"--decoupled-lr", "1e-3", "--eval-iters", "0"}), {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<TbEvent> events = testing::read_scalar_events(dir);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events[0].tag, "learning-rate");
  EXPECT_EQ(events[1].tag, "learning-rate vs samples");
  EXPECT_EQ(events[2].tag, "lm loss");
  EXPECT_TRUE(values_of(events, "decoupled-learning-rate").empty());
  EXPECT_EQ(r.output.find("decoupled learning rate"), std::string::npos) << r.output;
  EXPECT_EQ(testing::logged_values(r.output, "learning rate").size(), 4u) << r.output;
}

TEST(GaleTensorBoard, FollowsTheIntervalAndTheLogFlags) {
  const std::string dir = fresh_dir("gale_tb_cli_flags");
  test::RunResult r = test::run_with_timeout(
      tiny(1, dir,
           {"--tensorboard-log-interval", "2", "--tensorboard-queue-size", "3", "--log-timers-to-tensorboard",
            "--log-throughput", "--log-memory-to-tensorboard", "--log-world-size-to-tensorboard",
            "--log-batch-size-to-tensorboard", "--no-log-learnig-rate-to-tensorboard",
            "--no-log-loss-scale-to-tensorboard", "--log-params-norm", "--log-num-zeros-in-grad", "--eval-iters", "0"}),
      {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<TbEvent> events = testing::read_scalar_events(dir);
  std::vector<std::pair<std::string, int64_t>> expected;
  for (int64_t it = 1; it <= 4; ++it) {
    if (it % 2 == 0) {
      for (const char* tag : {"batch-size", "lm loss", "world-size", "grad-norm", "num-zeros", "params-norm"}) {
        expected.emplace_back(tag, it);
        expected.emplace_back(std::string(tag) + " vs samples", 4 * it);
      }
      for (const char* tag : {"mem-reserved-bytes", "mem-allocated-bytes", "mem-max-allocated-bytes",
                              "mem-allocated-count"})
        expected.emplace_back(tag, it);
    }
    expected.emplace_back("iteration-time", it);  // every log line (--log-interval 1)
    expected.emplace_back("throughput", it);
  }
  EXPECT_EQ(tags_and_steps(events), expected);
  for (float v : values_of(events, "batch-size")) EXPECT_EQ(v, 4.0f);
  for (float v : values_of(events, "world-size")) EXPECT_EQ(v, 1.0f);
  const std::vector<double> norms = testing::logged_values(r.output, "params norm"), zeros = testing::logged_values(r.output, "num zeros");
  ASSERT_EQ(norms.size(), 4u);
  ASSERT_EQ(zeros.size(), 4u);
  const std::vector<float> norms_written = values_of(events, "params-norm");
  const std::vector<float> zeros_written = values_of(events, "num-zeros");
  ASSERT_EQ(norms_written.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_NEAR(norms_written[i], norms[2 * i + 1], 0.0005 + 1e-6 * norms[2 * i + 1]);  // printed with 3 decimals
    EXPECT_EQ(zeros_written[i], static_cast<float>(zeros[2 * i + 1]));
  }
  const std::vector<float> reserved = values_of(events, "mem-reserved-bytes");
  const std::vector<float> allocated = values_of(events, "mem-allocated-bytes");
  const std::vector<float> peak = values_of(events, "mem-max-allocated-bytes");
  const std::vector<float> count = values_of(events, "mem-allocated-count");
  ASSERT_EQ(allocated.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_GT(allocated[i], 0.0f);
    EXPECT_GE(reserved[i], allocated[i]);
    EXPECT_GE(peak[i], allocated[i]);
    EXPECT_GT(count[i], 0.0f);
  }
  for (float v : values_of(events, "iteration-time")) EXPECT_GT(v, 0.0f);
}

TEST(GaleTensorBoard, OnlyTheLastRankWrites) {
  const std::string dir = fresh_dir("gale_tb_cli_pp2");
  test::RunResult r =
      test::run_with_timeout(tiny(2, dir, {"--pipeline-model-parallel-size", "2", "--eval-iters", "0"}), kMpiEnv, 600);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<TbEvent> events = testing::read_scalar_events(dir);  // exactly one file
  const std::vector<double> logged = testing::logged_values(r.output, "lm loss");
  const std::vector<float> written = values_of(events, "lm loss");
  ASSERT_EQ(logged.size(), 4u);
  ASSERT_EQ(written.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(written[i], logged[i], 1e-6 * logged[i]);
}

TEST(GaleTensorBoard, UnwritableDirectoryIsAStartUpError) {
  const std::string base = fresh_dir("gale_tb_cli_bad");
  fs::create_directories(base);
  const std::string file = base + "/not-a-dir";
  std::ofstream(file) << "x";
  test::RunResult r = test::run_with_timeout(tiny(1, file + "/tb", {}), {}, 120);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("gale pretrain: error: --tensorboard-dir: cannot create directory " + file + "/tb: "),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("training ..."), std::string::npos);  // stopped at start-up
}

}  // namespace
}  // namespace gale
