// --optimizer-selection fused_ema_adamw with the distributed optimizer at DP2 under mpirun: the EMA
// is sharded like the Adam moments (each rank holds its owned elements only, 12 bytes per owned
// element in all), training is the distributed fused_adamw run's bit for bit, each rank's EMA shard
// equals the replicated (plain data-parallel) run's EMA of those elements within 1e-6 relative (the
// two reduce the gradients in different orders), and a DP2 checkpoint resumes at DP2 with the
// distributed optimizer bit for bit (EMA included) and loads at DP2 without it with the same EMA.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "mpi_test_env.h"
#include "optimizer_test_model.h"
#include "testing_checkpoint_run.h"
#include "train/checkpointing.h"
#include "train/grad_sync.h"

namespace gale {
namespace {

const std::vector<std::string> kEma = {"--optimizer-selection", "fused_ema_adamw", "--ema-decay", "0.95"};

struct EmaRun : testing::CheckpointRun {
  EmaRun(const Comm& world, const std::vector<std::string>& flags)
      : CheckpointRun(testing::join({testing::optimizer_test_model("6", "0.1"), flags}), world, testing::kTinyVocab,
                       EngineOptions{20000, {}}) {}
  Tensor ema() const {
    for (const auto& [name, t] : engine->optimizer->state(0))
      if (name == "ema_params") return t;
    return Tensor();
  }
  std::vector<uint32_t> ema_bits() const {
    const Tensor e = ema();
    std::vector<uint32_t> out(static_cast<size_t>(e.numel()));
    std::memcpy(out.data(), e.data<float>(), out.size() * sizeof(float));
    return out;
  }
};

const std::vector<std::string> kDistOpt = {"--use-distributed-optimizer", "--overlap-grad-reduce"};

TEST(EmaAdamWDp, ShardedEmaMatchesTheReplicatedRun) {
  Comm world = test::world();
  if (world->size() != 2) GTEST_SKIP() << "needs DP2";
  EmaRun replicated(world, kEma), sharded(world, testing::join({kEma, kDistOpt})),
      adam(world, kDistOpt);
  ASSERT_TRUE(sharded.engine->optimizer->sharded());
  ASSERT_GT(sharded.engine->dp_sync[0]->buckets().size(), 2u);
  const int64_t n = sharded.engine->chunks[0]->params().trainable_numel();
  const int64_t owned = sharded.ema().numel();
  EXPECT_EQ(world->all_reduce_scalar(owned), n) << "every element's EMA on exactly one rank";
  EXPECT_EQ(sharded.engine->optimizer->state_bytes(), 12 * owned);
  EXPECT_EQ(replicated.engine->optimizer->state_bytes(), 12 * n);
  const std::vector<double> a = adam.train(5), b = sharded.train(5), c = replicated.train(5);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(a[i], b[i]) << "the EMA changes no bit of training: iteration " << i + 1;
    EXPECT_NEAR(b[i], c[i], 1e-5 * std::fabs(c[i])) << "iteration " << i + 1;
  }
  EXPECT_EQ(adam.values(), sharded.values());
  const float* whole = replicated.ema().data<float>();
  const float* shard = sharded.ema().data<float>();
  int64_t checked = 0;
  double worst = 0;
  for (const Optimizer::Segment& seg : sharded.engine->optimizer->segments())
    for (int64_t i = 0; i < seg.numel; ++i, ++checked) {
      const double want = whole[seg.begin + i], got = shard[seg.state_offset + i];
      worst = std::max(worst, std::fabs(got - want) / (1e-3 + std::fabs(want)));
    }
  EXPECT_EQ(checked, owned);
  EXPECT_LT(worst, 1e-6) << "largest relative EMA difference";
  // The EMA is not the parameters (it lags them).
  const std::vector<uint32_t> p = sharded.values();
  int64_t differ = 0;
  for (const Optimizer::Segment& seg : sharded.engine->optimizer->segments())
    for (int64_t i = 0; i < seg.numel; ++i) {
      float pv;
      std::memcpy(&pv, &p[static_cast<size_t>(seg.begin + i)], sizeof pv);
      differ += pv != shard[seg.state_offset + i];
    }
  EXPECT_GT(differ, owned / 2);
}

TEST(EmaAdamWDp, CheckpointResumesBitwiseAndReshards) {
  Comm world = test::world();
  if (world->size() != 2) GTEST_SKIP() << "needs DP2";
  int64_t pid = world->rank() == 0 ? static_cast<int64_t>(::getpid()) : 0;
  pid = world->all_reduce_scalar(pid, ReduceOp::kMax);
  const std::string dir = (std::filesystem::temp_directory_path() / ("gale_ema_dp2_" + std::to_string(pid))).string();
  if (world->rank() == 0) std::filesystem::remove_all(dir);
  world->barrier();
  const std::vector<std::string> flags = testing::join({kEma, kDistOpt});
  EmaRun whole(world, flags);
  const std::vector<double> expected = whole.train(6);
  EmaRun first(world, testing::join({flags, {"--save", dir, "--save-interval", "3"}}));
  first.train(3);
  ASSERT_TRUE(save_checkpoint(first.args, *first.engine, first.trainer->state()).ok());
  world->barrier();
  {
    EmaRun second(world, testing::join({flags, {"--load", dir}}));
    bool loaded = false;
    ASSERT_TRUE(load_checkpoint(second.args, *second.engine, second.trainer->state(), &loaded).ok());
    ASSERT_TRUE(loaded);
    EXPECT_EQ(second.ema_bits(), first.ema_bits());
    const std::vector<double> b = second.train(3);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(b[i], expected[3 + i]) << "iteration " << 4 + i;
    EXPECT_EQ(second.values(), whole.values());
    EXPECT_EQ(second.ema_bits(), whole.ema_bits()) << "the EMA continues bit for bit";
  }
  {  // Without the distributed optimizer every rank reads the whole EMA: the shards of both ranks.
    EmaRun replicated(world, testing::join({kEma, {"--load", dir}}));
    bool loaded = false;
    ASSERT_TRUE(load_checkpoint(replicated.args, *replicated.engine, replicated.trainer->state(), &loaded).ok());
    const float* full = replicated.ema().data<float>();
    const float* shard = first.ema().data<float>();
    int64_t same = 0, owned = 0;
    for (const Optimizer::Segment& seg : first.engine->optimizer->segments())
      for (int64_t i = 0; i < seg.numel; ++i, ++owned) same += full[seg.begin + i] == shard[seg.state_offset + i];
    EXPECT_EQ(same, owned);
  }
  world->barrier();
  if (world->rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace gale
