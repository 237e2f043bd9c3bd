// --swap-optimizer with the distributed optimizer at DP2 under mpirun: each rank's shard of the Adam
// state lives in its own file, and training (losses, gradient norms, parameters, the state read
// back) is the unswapped DP2 run's, bit for bit, with 3 uneven chunks and with more chunks than
// buckets (16); so is PP2 with two model chunks per rank (two optimizer buffers in one file); a DP2
// checkpoint saved with the flag resumes with and without it, bit for bit.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "mpi_test_env.h"
#include "optimizer_test_model.h"
#include "testing_checkpoint_run.h"
#include "train/checkpointing.h"
#include "train/grad_sync.h"

namespace gale {
namespace {

struct SwapRun : testing::CheckpointRun {
  SwapRun(const Comm& world, const std::vector<std::string>& flags)
      : CheckpointRun(testing::join({testing::optimizer_test_model("6", "0.1"),
                                      {"--use-distributed-optimizer", "--overlap-grad-reduce"}, flags}),
                       world, testing::kTinyVocab, EngineOptions{20000, {}}) {}
};

std::vector<std::string> swap_flags(int64_t times) {
  return {"--swap-optimizer", "--swap-optimizer-times", std::to_string(times)};
}

TEST(SwapOptimizerDp, ShardedStateSwapsBitIdentically) {
  Comm world = test::world();
  if (world->size() != 2) GTEST_SKIP() << "needs DP2";
  SwapRun plain(world, {});
  ASSERT_GT(plain.engine->dp_sync[0]->buckets().size(), 2u);
  plain.train(4);
  for (int64_t times : {3, 16}) {
    SwapRun swapped(world, swap_flags(times));
    const std::vector<double> b = swapped.train(4);
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(plain.losses[i], b[i]) << "times " << times << " iteration " << i + 1;
      EXPECT_EQ(plain.grad_norms[i], swapped.grad_norms[i]) << "times " << times << " iteration " << i + 1;
    }
    EXPECT_EQ(plain.values(), swapped.values()) << "times " << times;
    const auto ps = plain.engine->optimizer->state(0), ss = swapped.engine->optimizer->state(0);
    ASSERT_EQ(ps.size(), 2u);
    ASSERT_EQ(ss.size(), 2u);
    for (size_t k = 0; k < 2; ++k) {
      ASSERT_EQ(ps[k].second.numel(), ss[k].second.numel());
      EXPECT_EQ(std::memcmp(ps[k].second.data<float>(), ss[k].second.data<float>(), ps[k].second.nbytes()), 0)
          << ps[k].first << " times " << times;
    }
    // The shard's state only: one file per rank, half the elements each.
    EXPECT_EQ(swapped.engine->optimizer->swap()->file_bytes(), plain.engine->optimizer->state_bytes());
    EXPECT_LT(swapped.engine->optimizer->state_bytes(), plain.engine->optimizer->state_bytes() / (times - 1));
  }
}

// PP2 with two virtual stages per rank: two model chunks (two optimizer buffers) per rank whose
// states follow each other in the file, the chunks planned over both.
TEST(SwapOptimizerDp, TwoModelChunksPerRankSwapBitIdentically) {
  Comm world = test::world();
  if (world->size() != 2) GTEST_SKIP() << "needs PP2";
  const std::vector<std::string> pp = {"--pipeline-model-parallel-size", "2", "--num-virtual-stages-per-pipeline-rank",
                                       "2", "--num-layers", "4"};
  SwapRun plain(world, pp);
  SwapRun swapped(world, testing::join({pp, swap_flags(3)}));
  ASSERT_EQ(swapped.engine->optimizer->num_buffers(), 2u);
  const std::vector<double> a = plain.train(4), b = swapped.train(4);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(a[i], b[i]) << "iteration " << i + 1;
  EXPECT_EQ(plain.engine->optimizer->params_norm(), swapped.engine->optimizer->params_norm());
  for (size_t c = 0; c < 2; ++c) {
    const auto ps = plain.engine->optimizer->state(c), ss = swapped.engine->optimizer->state(c);
    ASSERT_EQ(ps.size(), ss.size());
    for (size_t k = 0; k < ps.size(); ++k) {
      ASSERT_EQ(ps[k].second.numel(), ss[k].second.numel());
      EXPECT_EQ(std::memcmp(ps[k].second.data<float>(), ss[k].second.data<float>(), ps[k].second.nbytes()), 0)
          << ps[k].first << " of chunk " << c;
    }
  }
}

TEST(SwapOptimizerDp, CheckpointResumesWithAndWithoutTheFlag) {
  Comm world = test::world();
  if (world->size() != 2) GTEST_SKIP() << "needs DP2";
  int64_t pid = world->rank() == 0 ? static_cast<int64_t>(::getpid()) : 0;
  pid = world->all_reduce_scalar(pid, ReduceOp::kMax);
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("gale_swapopt_dp2_" + std::to_string(pid))).string();
  if (world->rank() == 0) std::filesystem::remove_all(dir);
  world->barrier();
  SwapRun whole(world, {});
  const std::vector<double> expected = whole.train(6);
  const std::vector<uint32_t> expected_values = whole.values();
  SwapRun first(world, testing::join({{"--save", dir, "--save-interval", "3"}, swap_flags(3)}));
  first.train(3);
  ASSERT_TRUE(save_checkpoint(first.args, *first.engine, first.trainer->state()).ok());
  world->barrier();
  for (const std::vector<std::string>& flags : {std::vector<std::string>{}, swap_flags(5)}) {
    SwapRun second(world, testing::join({{"--load", dir}, flags}));
    bool loaded = false;
    ASSERT_TRUE(load_checkpoint(second.args, *second.engine, second.trainer->state(), &loaded).ok());
    ASSERT_TRUE(loaded);
    const std::vector<double> b = second.train(3);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(b[i], expected[3 + i]) << flags.size() << " iteration " << 4 + i;
    EXPECT_EQ(second.values(), expected_values);
  }
  world->barrier();
  if (world->rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace gale
