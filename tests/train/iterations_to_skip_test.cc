// --iterations-to-skip: a skipped iteration draws its global batch (the next iteration sees the
// next batch; consumed and skipped samples advance) and changes nothing else: no parameter update,
// no scheduler step, no log line. A run saved and resumed across skips continues bit-for-bit.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <regex>

#include "testing_run.h"
#include "train/checkpointing.h"

namespace gale {
namespace {

struct SkipRun : testing::TestRun {
  explicit SkipRun(const std::vector<std::string>& extra, int train_iters = 6)
      : TestRun(testing::join({{"--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
                                "--seq-length", "16", "--max-position-embeddings", "16", "--micro-batch-size", "2",
                                "--global-batch-size", "4", "--train-iters", std::to_string(train_iters), "--lr",
                                "3e-3", "--lr-warmup-iters", "2", "--lr-decay-style", "cosine", "--mock-data",
                                "--hidden-dropout", "0.1",
                                "--eval-iters", "0", "--log-interval", "1", "--make-vocab-size-divisible-by", "64"},
                               extra}),
                make_self_communicator("world"), 60) {}
  const float* params() { return model().params().flat_params().data<float>(); }
  int64_t numel() { return model().params().numel(); }
};

void expect_same_params(SkipRun& a, SkipRun& b) {
  ASSERT_EQ(a.numel(), b.numel());
  for (int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(a.params()[i], b.params()[i]) << "parameter element " << i;
}

// Iterations are counted from 0 as in Megatron: "--iterations-to-skip 1" skips the one logged as 2.
TEST(IterationsToSkip, DrawsTheBatchAndChangesNothingElse) {
  SkipRun skipping({"--iterations-to-skip", "1"}, 3);
  ::testing::internal::CaptureStdout();
  ASSERT_TRUE(skipping.trainer->run().ok());
  const std::string log = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(skipping.trainer->state().iteration, 3);
  EXPECT_EQ(skipping.trainer->state().consumed_train_samples, 12);
  EXPECT_EQ(skipping.trainer->state().skipped_train_samples, 4);

  // The same by hand: one step, the second global batch passed over, one step.
  SkipRun by_hand({}, 3);
  by_hand.train(1);
  by_hand.trainer->state().consumed_train_samples += 4;
  by_hand.train(1);
  expect_same_params(skipping, by_hand);
  EXPECT_EQ(skipping.engine->scheduler->lr(), by_hand.engine->scheduler->lr());  // stepped twice

  // Megatron's log: no line for the skipped iteration; the next ones count its samples as skipped.
  EXPECT_NE(log.find("iteration        1/       3 | consumed samples:            4 | elapsed"), std::string::npos)
      << log;
  EXPECT_EQ(log.find("iteration        2/"), std::string::npos) << log;
  EXPECT_NE(log.find("iteration        3/       3 | consumed samples:           12 | skipped samples:            4 |"),
            std::string::npos)
      << log;
  // Two lines, each after one trained iteration: "number of skipped iterations" counts only
  // iterations whose update the optimizer rejected.
  std::regex line(R"(number of skipped iterations: +0 \|)");
  EXPECT_EQ(std::distance(std::sregex_iterator(log.begin(), log.end(), line), std::sregex_iterator()), 2) << log;

  // And not a run that trains every batch.
  SkipRun every({}, 3);
  every.train(2);
  bool differs = false;
  for (int64_t i = 0; i < every.numel() && !differs; ++i) differs = every.params()[i] != skipping.params()[i];
  EXPECT_TRUE(differs);
}

// Saved at an --exit-interval after one skip and resumed before another: the same parameters,
// consumed and skipped samples as the run without interruption.
TEST(IterationsToSkip, ResumeContinuesExactly) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("gale_skip_resume_" + std::to_string(::getpid()))).string();
  std::filesystem::remove_all(dir);
  const std::vector<std::string> skips = {"--iterations-to-skip", "2", "4"};
  SkipRun whole(skips);
  ::testing::internal::CaptureStdout();
  ASSERT_TRUE(whole.trainer->run().ok());

  SkipRun first(testing::join({skips, {"--save", dir, "--save-interval", "100", "--exit-interval", "4"}}));
  first.trainer->set_save_fn([&](const TrainerState& s) { return save_checkpoint(first.args, *first.engine, s); });
  ASSERT_TRUE(first.trainer->run().ok());
  EXPECT_EQ(first.trainer->state().iteration, 4);

  SkipRun second(testing::join({skips, {"--load", dir}}));
  bool loaded = false;
  ASSERT_TRUE(load_checkpoint(second.args, *second.engine, second.trainer->state(), &loaded).ok());
  ASSERT_TRUE(loaded);
  EXPECT_EQ(second.trainer->state().iteration, 4);
  EXPECT_EQ(second.trainer->state().skipped_train_samples, 4);
  ASSERT_TRUE(second.trainer->run().ok());
  ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(second.trainer->state().consumed_train_samples, whole.trainer->state().consumed_train_samples);
  EXPECT_EQ(second.trainer->state().skipped_train_samples, 8);
  EXPECT_EQ(whole.trainer->state().skipped_train_samples, 8);
  expect_same_params(second, whole);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace gale
