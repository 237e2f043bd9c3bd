// The distributed optimizer in whole training runs under mpirun: its fp32 state per rank is ~1/dp
// of the replicated optimizer's (exact allocator bytes), and its checkpoints reshard — saved at
// DP2 with the distributed optimizer, they resume at DP1, DP2, DP4, TP2 and TP2·DP2, with and
// without it, continuing with the losses of the uninterrupted single-process run.
//
// The layouts run side by side on sub-groups of the 4-rank world (two DP2 groups, four single
// ranks, ...), each rank also computing the single-process reference itself.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "core/allocator.h"
#include "mpi_test_env.h"
#include "optimizer_test_model.h"
#include "testing_checkpoint_run.h"
#include "train/checkpointing.h"
#include "train/engine.h"
#include "train/grad_sync.h"
#include "train/model_setup.h"
#include "train/trainer.h"

namespace gale {
namespace {

constexpr int64_t kVocab = 250;  // padded to 256 at TP 1 and 2

struct TrainingRun : testing::CheckpointRun {
  TrainingRun(const Comm& world, const std::vector<std::string>& flags, int64_t bucket_size = 0)
      : CheckpointRun(testing::join({testing::optimizer_test_model("6", "0.1"), flags}), world, kVocab,
                       EngineOptions{bucket_size, {}}) {}
};

// The elements of chunk 0 this rank's optimizer owns.
int64_t owned_elements(const Engine& e) {
  int64_t n = 0;
  for (const FlatRange& r : e.dp_sync[0]->owned_ranges()) n += r.size();
  return n;
}

TEST(DistributedOptimizer, StateBytesPerRankAreOneOverDp) {
  Comm world = test::world();
  if (world->size() == 1) GTEST_SKIP() << "needs data parallelism";
  const int64_t dp = world->size();
  TrainingRun replicated(world, {});
  TrainingRun sharded(world, {"--use-distributed-optimizer"});
  const ParamBuffer& pb = sharded.engine->chunks[0]->params();
  const int64_t n = pb.numel(), owned = owned_elements(*sharded.engine);
  // Exact bytes of the optimizers the engines built: two fp32 moments per owned element.
  EXPECT_EQ(replicated.engine->optimizer->state_bytes(), 8 * n);
  EXPECT_EQ(sharded.engine->optimizer->state_bytes(), 8 * owned);
  // The same, from the allocator's counters, for a fresh optimizer over the sharded ranges.
  OptimizedBuffer buffer{&sharded.engine->chunks[0]->params(), norm_counting(*sharded.engine->chunks[0]),
                         sharded.engine->dp_sync[0]->owned_ranges()};
  const int64_t before = host_allocator().current_bytes();
  {
    Optimizer opt(optimizer_config_from_args(sharded.args), {buffer}, &sharded.engine->ops, sharded.engine->ps.model(),
                  sharded.engine->ps.dp_cp());
    EXPECT_EQ(host_allocator().current_bytes() - before, 8 * owned);
  }
  // ~1/dp: at most one element per bucket above n/dp, and the shards add up to n.
  const int64_t buckets = static_cast<int64_t>(sharded.engine->dp_sync[0]->buckets().size());
  EXPECT_LE(owned, (n + dp - 1) / dp + buckets);
  EXPECT_EQ(world->all_reduce_scalar(owned), n);
  if (world->rank() == 0)
    std::printf("optimizer state per rank at DP%lld: %lld bytes replicated, %lld bytes distributed (%.4f)\n",
                static_cast<long long>(dp), static_cast<long long>(8 * n), static_cast<long long>(8 * owned),
                static_cast<double>(owned) / static_cast<double>(n));
}

// --overlap-param-gather only moves the all-gather into the next forward: with the same buckets
// the run is bit-identical to gathering right after the step — also under --bf16, whose GEMM copy
// of the weights must follow each gathered bucket.
TEST(DistributedOptimizer, OverlappedParamGatherChangesNoBit) {
  Comm world = test::world();
  if (world->size() == 1) GTEST_SKIP() << "needs data parallelism";
  for (bool bf16 : {false, true}) {
    std::vector<std::string> flags = {"--use-distributed-optimizer", "--overlap-grad-reduce"};
    if (bf16) flags.push_back("--bf16");
    TrainingRun at_step(world, flags, 20000);
    flags.push_back("--overlap-param-gather");
    TrainingRun in_forward(world, flags, 20000);
    ASSERT_GT(in_forward.engine->dp_sync[0]->buckets().size(), 2u);
    const std::vector<double> a = at_step.train(4), b = in_forward.train(4);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(a[i], b[i]) << (bf16 ? "--bf16, " : "") << "iteration " << i + 1;
  }
}

// --overlap-param-gather-with-optimizer-step only starts the first chunk's all-gather earlier (right
// after the optimizer updates that chunk, as one bucket): bit-identical to gathering in the forward
// with the same buckets.
TEST(DistributedOptimizer, ParamGatherWithOptimizerStepChangesNoBit) {
  Comm world = test::world();
  if (world->size() != 4) GTEST_SKIP() << "needs PP2 x DP2";
  const std::vector<std::string> flags = {"--pipeline-model-parallel-size", "2", "--num-virtual-stages-per-pipeline-rank",
                                          "2", "--num-layers", "4", "--use-distributed-optimizer",
                                          "--overlap-grad-reduce", "--overlap-param-gather"};
  std::vector<std::string> with_step = flags;
  with_step.push_back("--overlap-param-gather-with-optimizer-step");
  TrainingRun in_forward(world, flags);
  TrainingRun at_step(world, with_step);
  ASSERT_EQ(at_step.engine->dp_sync.size(), 2u);
  // One bucket, plus (on the first stage) the word embedding's own (shared with the last stage).
  EXPECT_EQ(at_step.engine->dp_sync[0]->buckets().size(), at_step.engine->ps.coords().pp == 0 ? 2u : 1u);
  EXPECT_TRUE(at_step.engine->dp_sync[0]->config().gather_right_after_step);
  EXPECT_FALSE(at_step.engine->dp_sync[1]->config().gather_right_after_step);
  const std::vector<double> a = in_forward.train(4), b = at_step.train(4);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(a[i], b[i]) << "iteration " << i + 1;
  // After a step the first chunk's gathers are already under way; the second chunk's wait for its forward.
  EXPECT_EQ(at_step.engine->dp_sync[0]->param_gathers_in_flight(),
            static_cast<int64_t>(at_step.engine->dp_sync[0]->buckets().size()));
  EXPECT_EQ(at_step.engine->dp_sync[1]->param_gathers_in_flight(), 0);
  EXPECT_EQ(in_forward.engine->dp_sync[0]->param_gathers_in_flight(), 0);
}

// A directory name every rank agrees on (rank 0's pid).
std::string shared_temp_dir(const Comm& world, const std::string& name) {
  int64_t pid = world->rank() == 0 ? static_cast<int64_t>(::getpid()) : 0;
  pid = world->all_reduce_scalar(pid, ReduceOp::kMax);
  return (std::filesystem::temp_directory_path() / ("gale_distopt_" + name + "_" + std::to_string(pid))).string();
}

void expect_losses(const std::vector<double>& got, const std::vector<double>& want, size_t first, const char* what) {
  ASSERT_LE(got.size() + first, want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[first + i], 1e-5 * want[first + i]) << what << ": loss of iteration " << first + i + 1;
}

TEST(DistributedOptimizer, CheckpointsReshardAcrossLayouts) {
  Comm world = test::world();
  if (world->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const int rank = world->rank();
  const std::string distopt_dir = shared_temp_dir(world, "dp2_distopt");
  const std::string plain_dir = shared_temp_dir(world, "dp2_plain");
  if (rank == 0) {
    std::filesystem::remove_all(distopt_dir);
    std::filesystem::remove_all(plain_dir);
  }
  world->barrier();

  // The uninterrupted single-process run.
  TrainingRun reference(make_self_communicator("world"), {});
  const std::vector<double> expected = reference.train(6);

  // Two DP2 groups: ranks {0, 1} save with the distributed optimizer, ranks {2, 3} without; each
  // also trains on uninterrupted for the bit-for-bit check at its own layout.
  Comm pair = world->make_group(rank < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3}, "pair");
  const bool distopt_pair = rank < 2;
  const std::string pair_dir = distopt_pair ? distopt_dir : plain_dir;
  std::vector<std::string> pair_flags = {"--save", pair_dir, "--save-interval", "3"};
  if (distopt_pair) pair_flags.push_back("--use-distributed-optimizer");
  std::vector<double> pair_uninterrupted;
  {
    TrainingRun first(pair, pair_flags);
    expect_losses(first.train(3), expected, 0, "DP2 before saving");
    ASSERT_TRUE(first.save().ok());
    pair_uninterrupted = first.train(3);
  }
  world->barrier();

  // Resume from `dir` on `group` with `flags`; the next three losses must continue the run.
  auto resume = [&](const Comm& group, const std::string& dir, std::vector<std::string> flags, const char* what) {
    flags.insert(flags.end(), {"--load", dir});
    TrainingRun r(group, flags);
    Status st = r.load();
    EXPECT_TRUE(st.ok()) << what << ": " << st.to_string();
    if (!st.ok()) return std::vector<double>{};
    EXPECT_EQ(r.trainer->state().iteration, 3) << what;
    std::vector<double> losses = r.train(3);
    expect_losses(losses, expected, 3, what);
    return losses;
  };

  // Same layout: bit for bit.
  {
    std::vector<std::string> flags;
    if (distopt_pair) flags.push_back("--use-distributed-optimizer");
    std::vector<double> again = resume(pair, pair_dir, flags, "DP2, same layout");
    ASSERT_EQ(again.size(), 3u);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(again[i], pair_uninterrupted[i]) << "DP2 resumed at its own layout";
  }
  // The DP2 distributed-optimizer checkpoint at every other layout.
  Comm self = make_self_communicator("world");
  resume(self, distopt_dir, {}, "DP1");
  resume(self, distopt_dir, {"--use-distributed-optimizer"}, "DP1 distributed optimizer");
  resume(pair, distopt_dir,
         distopt_pair ? std::vector<std::string>{} : std::vector<std::string>{"--use-distributed-optimizer"},
         "DP2, the other optimizer");
  resume(pair, distopt_dir, {"--tensor-model-parallel-size", "2"}, "TP2");
  resume(world, distopt_dir, {"--use-distributed-optimizer"}, "DP4 distributed optimizer");
  resume(world, distopt_dir, {}, "DP4");
  resume(world, distopt_dir,
         {"--tensor-model-parallel-size", "2", "--use-distributed-optimizer", "--sequence-parallel"},
         "TP2 DP2 distributed optimizer");
  // The replicated optimizer's DP2 checkpoint into the distributed optimizer.
  resume(world, plain_dir, {"--use-distributed-optimizer"}, "DP2 plain -> DP4 distributed optimizer");

  // The check has teeth: the same resumption with the Adam moments lost leaves the losses.
  {
    TrainingRun fresh(world, {"--use-distributed-optimizer", "--load", distopt_dir});
    ASSERT_TRUE(fresh.load().ok());
    for (auto& [name, t] : fresh.engine->optimizer->state(0)) t.zero();
    std::vector<double> losses = fresh.train(3);
    double worst = 0.0;
    for (int i = 0; i < 3; ++i) worst = std::max(worst, std::fabs(losses[i] - expected[3 + i]) / expected[3 + i]);
    EXPECT_GT(worst, 1e-4) << "losses after a resume without optimizer state should differ";
  }
  world->barrier();
  if (rank == 0) {
    std::filesystem::remove_all(distopt_dir);
    std::filesystem::remove_all(plain_dir);
  }
}

}  // namespace
}  // namespace gale
