// Megatron's batch-size ramp-up (--rampup-batch-size): the global batch size per consumed samples,
// micro-batches per data-parallel rank, the run's iterations, and the flag's one-line errors. The
// expected values are worked out by hand from RampupBatchsizeNumMicroBatchesCalculator.update
// and training.py's update_train_iters (tools/reference/batch_size_rampup.py prints them again).
#include <gtest/gtest.h>

#include "pretrain_cli.h"
#include "train/batch_size_rampup.h"
#include "train/model_setup.h"

namespace gale {
namespace {

NumMicroBatchesCalculator ramp(int64_t gbs, int64_t mbs, int64_t dp, BatchSizeRampup r) {
  StatusOr<NumMicroBatchesCalculator> c = NumMicroBatchesCalculator::create(gbs, mbs, dp, &r);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return c.ok() ? c.value() : NumMicroBatchesCalculator{};
}

// 4 -> 16 by 4 over 100 samples: 3 increments of 100/3 = 33.33... samples each.
TEST(BatchSizeRampup, GlobalBatchSizeByConsumedSamples) {
  const NumMicroBatchesCalculator c = ramp(16, 2, 1, {4, 4, 100});
  EXPECT_TRUE(c.ramps_up());
  EXPECT_EQ(c.global_batch_size(0), 4);
  EXPECT_EQ(c.global_batch_size(33), 4);   // int(33 / 33.33) = 0
  EXPECT_EQ(c.global_batch_size(34), 8);   // int(1.02) = 1
  EXPECT_EQ(c.global_batch_size(66), 8);   // int(1.98) = 1
  EXPECT_EQ(c.global_batch_size(67), 12);  // int(2.01) = 2
  EXPECT_EQ(c.global_batch_size(99), 12);  // int(2.97) = 2
  // The last increment: 100 / (100 / 3) is exactly 3.0 in doubles, so the final size is reached
  // at consumed == ramp-up samples; beyond them it is the final size however far training goes.
  EXPECT_EQ(c.global_batch_size(100), 16);
  EXPECT_EQ(c.global_batch_size(101), 16);
  EXPECT_EQ(c.global_batch_size(1'000'000'000), 16);
  // Micro-batches per rank: global / (micro-batch size 2 x DP 1).
  EXPECT_EQ(c.num_micro_batches(0).value(), 2);
  EXPECT_EQ(c.num_micro_batches(34).value(), 4);
  EXPECT_EQ(c.num_micro_batches(67).value(), 6);
  EXPECT_EQ(c.num_micro_batches(5000).value(), 8);
}

// Python's float arithmetic, not exact fractions: 1 -> 8 by 1 over 9 samples is 7 increments of
// 9/7 samples, and 9 / (9/7) is 6.999999999999999 in doubles, so at 9 consumed samples the size is
// still 1 + 6 = 7 (exact arithmetic would say 8); at 10 > 9 it is capped at 8.
TEST(BatchSizeRampup, FollowsPythonsFloatingPointAtTheLastIncrement) {
  const NumMicroBatchesCalculator c = ramp(8, 1, 1, {1, 1, 9});
  EXPECT_EQ(c.global_batch_size(8), 7);  // int(8 / 1.2857) = int(6.22) = 6
  EXPECT_EQ(c.global_batch_size(9), 7);
  EXPECT_EQ(c.global_batch_size(10), 8);
}

// Megatron's update_train_iters: ramp-up iterations while consumed <= ramp-up samples and <= train
// samples, then whole final batches of the rest.
TEST(BatchSizeRampup, TrainItersForSamples) {
  const NumMicroBatchesCalculator c = ramp(16, 2, 1, {4, 4, 100});
  // Ramp-up: 9 x 4 (0..36), 4 x 8 (36..68), 3 x 12 (68..104): 16 iterations, 104 > 100 samples.
  // Then (1000 - 104) // 16 = 56 more.
  EXPECT_EQ(c.train_iters_for_samples(1000), 72);
  EXPECT_EQ(c.train_iters_for_samples(1000 + 15), 72);  // a partial last batch is dropped
  EXPECT_EQ(c.train_iters_for_samples(1000 + 16), 73);
  // Fewer train samples than ramp-up samples: 9 x 4, then 36 -> 44 -> 52 (the loop runs while
  // consumed <= 50, so it overshoots once); nothing is left for the constant phase.
  EXPECT_EQ(c.train_iters_for_samples(50), 11);
  // The ramp-up loop also runs at consumed == ramp-up samples: 1 -> 2 by 1 over 3 samples with 3
  // train samples trains 1, 1, 1 (3 consumed, still <= 3) and then 2: 4 iterations, 5 samples.
  EXPECT_EQ(ramp(2, 1, 1, {1, 1, 3}).train_iters_for_samples(3), 4);
  // Without ramp-up: train samples // global batch size.
  StatusOr<NumMicroBatchesCalculator> constant = NumMicroBatchesCalculator::create(16, 2, 1, nullptr);
  ASSERT_TRUE(constant.ok());
  EXPECT_FALSE(constant->ramps_up());
  EXPECT_EQ(constant->train_iters_for_samples(1000), 62);
  EXPECT_EQ(constant->global_batch_size(123), 16);
  EXPECT_EQ(constant->num_micro_batches(0).value(), 8);
}

// Data parallelism: micro-batches per rank are global / (micro-batch size x DP), checked at every
// step; 4 -> 8 by 2 over 20 samples passes through 6, which 2 x 2 does not divide.
TEST(BatchSizeRampup, DataParallelDivisibilityIsCheckedPerStep) {
  const NumMicroBatchesCalculator c = ramp(8, 2, 2, {4, 2, 20});
  EXPECT_EQ(c.num_micro_batches(0).value(), 1);
  EXPECT_EQ(c.global_batch_size(10), 6);
  Status s = c.num_micro_batches(10).status();
  EXPECT_EQ(s.message(),
            "--rampup-batch-size: the global batch size 6 after 10 consumed samples is not divisible by "
            "--micro-batch-size 2 times the data-parallel size 2");
  EXPECT_EQ(c.num_micro_batches(21).value(), 2);
}

TEST(BatchSizeRampup, ParsesTheFlagsThreeIntegers) {
  StatusOr<BatchSizeRampup> r = parse_rampup_batch_size({"16", "8", "300000"});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->start_global_batch_size, 16);
  EXPECT_EQ(r->batch_size_increment, 8);
  EXPECT_EQ(r->rampup_samples, 300000);
}

std::vector<std::string> sample_based(std::vector<std::string> extra) {
  std::vector<std::string> argv = {"--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
                                   "--seq-length", "16", "--max-position-embeddings", "32", "--micro-batch-size", "2",
                                   "--global-batch-size", "16", "--train-samples", "1000", "--lr", "1e-3",
                                   "--mock-data"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

TEST(BatchSizeRampup, FlagSetsTheRunsIterations) {
  testing::PretrainCli c;
  ASSERT_TRUE(c.parse(sample_based({"--rampup-batch-size", "4", "4", "100"})).ok());
  EXPECT_EQ(c.args.training.rampup_batch_size, (std::vector<std::string>{"4", "4", "100"}));
  EXPECT_EQ(train_iters_from_args(c.args), 72);
  testing::PretrainCli constant;
  ASSERT_TRUE(constant.parse(sample_based({})).ok());
  EXPECT_EQ(train_iters_from_args(constant.args), 62);
}

struct FlagError {
  std::vector<std::string> argv;
  std::string message;
};

TEST(BatchSizeRampup, FlagErrorsNameTheFlag) {
  const FlagError cases[] = {
      {testing::minimal_pretrain_flags(), ""},  // placeholder replaced below (iteration-based)
      {sample_based({"--rampup-batch-size", "4", "4"}),
       "--rampup-batch-size: expected 3 values <start batch size> <batch size increment> <ramp-up samples>, found 2"},
      {sample_based({"--rampup-batch-size", "4", "x", "100"}),
       "--rampup-batch-size: expected an integer batch size increment, found 'x'"},
      {sample_based({"--rampup-batch-size", "0", "4", "100"}),
       "--rampup-batch-size: expected a positive start batch size, found 0"},
      {sample_based({"--rampup-batch-size", "4", "0", "100"}),
       "--rampup-batch-size: expected a positive batch size increment, found 0"},
      {sample_based({"--rampup-batch-size", "4", "4", "-1"}),
       "--rampup-batch-size: expected non-negative ramp-up samples, found -1"},
      {sample_based({"--rampup-batch-size", "32", "4", "100"}),
       "--rampup-batch-size: the start batch size 32 must not exceed --global-batch-size 16"},
      {sample_based({"--rampup-batch-size", "4", "5", "100"}),
       "--rampup-batch-size: --global-batch-size 16 minus the start batch size 4 (12) must be divisible by the batch "
       "size increment 5"},
      {sample_based({"--rampup-batch-size", "16", "4", "100"}),
       "--rampup-batch-size: the start batch size equals --global-batch-size 16; expected a smaller start batch size "
       "(or no --rampup-batch-size)"},
      {sample_based({"--rampup-batch-size", "4", "4", "0"}),
       "--rampup-batch-size: expected positive ramp-up samples, found 0"},
  };
  for (size_t i = 0; i < std::size(cases); ++i) {
    std::vector<std::string> argv = cases[i].argv;
    std::string message = cases[i].message;
    if (i == 0) {  // Megatron: "expected no batch-size rampup for iteration-based training"
      argv.insert(argv.end(), {"--global-batch-size", "16", "--rampup-batch-size", "4", "4", "100"});
      message = "--rampup-batch-size needs sample-based training (--train-samples), not --train-iters";
    }
    testing::PretrainCli c;
    Status s = c.parse(argv);
    EXPECT_EQ(s.message(), message) << "case " << i;
  }
}

// --decrease-batch-size-if-needed (Megatron's _round): each iteration runs the global batch size
// rounded down to a multiple of micro-batch size x DP; the ramp-up itself follows the unrounded size.
TEST(BatchSizeRampup, DecreaseBatchSizeIfNeededRoundsDown) {
  StatusOr<NumMicroBatchesCalculator> constant = NumMicroBatchesCalculator::create(10, 2, 2, nullptr, true);
  ASSERT_TRUE(constant.ok());
  EXPECT_EQ(constant->global_batch_size(0), 10);
  EXPECT_EQ(constant->running_global_batch_size(0), 8);
  EXPECT_EQ(constant->num_micro_batches(0).value(), 2);
  BatchSizeRampup r{4, 2, 20};  // 4 -> 8 by 2: increments after 10 samples
  StatusOr<NumMicroBatchesCalculator> c = NumMicroBatchesCalculator::create(8, 2, 2, &r, true);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->global_batch_size(10), 6);  // the step the plain calculator refuses
  EXPECT_EQ(c->running_global_batch_size(10), 4);
  EXPECT_EQ(c->num_micro_batches(10).value(), 1);
  EXPECT_EQ(c->running_global_batch_size(21), 8);
  StatusOr<NumMicroBatchesCalculator> tiny = NumMicroBatchesCalculator::create(8, 2, 2, &(r = {2, 2, 20}), true);
  ASSERT_TRUE(tiny.ok());
  EXPECT_EQ(tiny->num_micro_batches(0).status().message(),
            "--decrease-batch-size-if-needed: the global batch size 2 after 0 consumed samples is smaller than "
            "--micro-batch-size 2 times the data-parallel size 2: no micro-batch to run");
  testing::PretrainCli cli;
  EXPECT_TRUE(cli.parse(sample_based({"--rampup-batch-size", "4", "4", "100", "--decrease-batch-size-if-needed"})).ok());
}

}  // namespace
}  // namespace gale
