// ZeRO-3 (--use-custom-fsdp --data-parallel-sharding-strategy optim_grads_params), ZeRO-2
// (optim_grads) and MindSpeed's LayerZeRO (--layerzero, every zero3_size) in whole training runs
// under mpirun at DP 2 and 4: the losses, gradient norms and updated parameters of plain data
// parallelism (several micro-batches per rank: gradient accumulation), at most two units gathered
// at once and none between iterations, the exact bytes each rank holds against plain data
// parallelism and the distributed optimizer, and checkpoints in the common format (resumed bit for
// bit at their own layout, and by plain data parallelism, the other variants and one process).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/allocator.h"
#include "mpi_test_env.h"
#include "zero3_testing.h"
#include "train/checkpointing.h"
#include "train/grad_sync.h"

namespace gale {
namespace {

using testing::shard_vs_replicated;
using testing::Zero3Run;

const std::vector<std::string> kZero3 = {"--use-custom-fsdp", "--data-parallel-sharding-strategy",
                                         "optim_grads_params"};
const std::vector<std::string> kZero2 = {"--use-custom-fsdp", "--data-parallel-sharding-strategy", "optim_grads"};

// --layerzero with a configuration file of `zero3_size` (one file per rank and size).
std::vector<std::string> layerzero(const Comm& world, int64_t zero3_size) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("gale_layerzero_" + std::to_string(::getpid()) + "_" + std::to_string(world->rank()) +
                             "_" + std::to_string(zero3_size) + ".yaml"))
                               .string();
  std::ofstream f(path);
  f << "zero3_size: " << zero3_size << "\nparam_dtype: fp32\nreduce_dtype: fp32\n";
  return {"--layerzero", "--layerzero-config", path};
}


// `flags` (ZeRO-2, ZeRO-3 or LayerZeRO) against plain data parallelism on the same ranks, GPT (tied
// embeddings: the pinned unit) and LLaMA (untied): 5 iterations of 8 micro-batches of one sample
// (gradient accumulation over 8/dp per rank).
void expect_trains_as_plain(const Comm& world, const std::vector<std::string>& flags, const std::string& label,
                            int max_gathered) {
  for (const auto* model : {&testing::kTinyGpt, &testing::kTinyLlama}) {
    const std::string what = label + (model == &testing::kTinyGpt ? ", GPT (tied embeddings)" : ", LLaMA (untied)");
    Zero3Run plain(world, *model, {});
    Zero3Run zero3(world, *model, flags);
    ASSERT_EQ(zero3.engine->zero3.size(), 1u) << what;
    EXPECT_TRUE(zero3.engine->dp_sync.empty());
    const ParamBuffer& pb = zero3.model().params();
    ASSERT_TRUE(pb.sharded());
    EXPECT_EQ(pb.num_units(), 3 + 2);  // embedding, 3 layers, head
    plain.train(5);
    zero3.train(5);
    for (int i = 0; i < 5; ++i) {
      EXPECT_NEAR(zero3.losses[i], plain.losses[i], 1e-6 * plain.losses[i]) << what << ", loss of iteration " << i + 1;
      EXPECT_NEAR(zero3.grad_norms[i], plain.grad_norms[i], 1e-5 * plain.grad_norms[i])
          << what << ", grad norm of iteration " << i + 1;
    }
    EXPECT_LT(shard_vs_replicated(pb, plain.model().params()), 1e-5) << what;
    // Between iterations nothing is gathered; during one, at most the unit in use and the pinned
    // (tied) embedding.
    EXPECT_EQ(zero3.engine->zero3[0]->gathered_units(), 0) << what;
    EXPECT_LE(zero3.engine->zero3[0]->max_gathered_units(), max_gathered) << what;
    // What the optimizers update tiles the model: every element exactly once over the DP group.
    int64_t owned = 0;
    for (const FlatRange& r : zero3.engine->zero3[0]->owned_ranges()) owned += r.size();
    EXPECT_EQ(world->all_reduce_scalar(owned), pb.numel()) << what;
  }
}

TEST(Zero3, TrainsAsPlainDataParallelism) {
  Comm world = test::world();
  if (world->size() == 1) GTEST_SKIP() << "needs data parallelism";
  expect_trains_as_plain(world, kZero3, "ZeRO-3", 2);
}

TEST(Zero3, Zero2TrainsAsPlainDataParallelism) {
  Comm world = test::world();
  if (world->size() == 1) GTEST_SKIP() << "needs data parallelism";
  expect_trains_as_plain(world, kZero2, "ZeRO-2", 2);
}

// LayerZeRO with every zero3_size that divides DP: 1 (ZeRO-1 only), sub-groups, DP (plain ZeRO-3).
TEST(Zero3, LayerZeroTrainsAsPlainDataParallelism) {
  Comm world = test::world();
  if (world->size() == 1) GTEST_SKIP() << "needs data parallelism";
  for (int64_t z = 1; z <= world->size(); z *= 2)
    expect_trains_as_plain(world, layerzero(world, z), "LayerZeRO zero3_size " + std::to_string(z), 2);
}

// Exact bytes (the allocator's counters) a rank holds for one run, above what the process held
// before building it: after two iterations (persistent: parameters, gradients, optimizer state,
// data), the peak during those iterations (a third one after two: the optimizer state exists),
// and the peak while building the engine (initialisation materialises the whole parameters once).
struct Bytes {
  int64_t persistent = 0, step_peak = 0, build_peak = 0;
};

Bytes measure(const Comm& world, const std::vector<std::string>& flags, int64_t* params) {
  const int64_t base = host_allocator().current_bytes();
  host_allocator().reset_peak();
  Bytes b;
  {
    Zero3Run run(world, testing::kTinyLlama, testing::join({{"--num-layers", "4", "--hidden-size", "128"}, flags}));
    b.build_peak = host_allocator().peak_bytes() - base;
    run.train(2);
    *params = run.model().params().numel();
    b.persistent = host_allocator().current_bytes() - base;
    host_allocator().reset_peak();
    run.train(1);
    b.step_peak = host_allocator().peak_bytes() - base;
  }
  return b;
}

TEST(Zero3, PeakMemoryDrops) {
  Comm world = test::world();
  if (world->size() == 1) GTEST_SKIP() << "needs data parallelism";
  const int64_t dp = world->size();
  int64_t n = 0;
  const Bytes plain = measure(world, {}, &n);
  const Bytes distopt = measure(world, {"--use-distributed-optimizer"}, &n);
  const Bytes zero3 = measure(world, kZero3, &n);
  const Bytes zero2 = measure(world, kZero2, &n);
  const Bytes lz = measure(world, layerzero(world, 2), &n);  // sub-groups of 2 (at DP 2: ZeRO-3)
  // ZeRO-2: values whole, gradients and state sharded: 4 + 12/dp bytes per parameter.
  EXPECT_LT(zero2.persistent, distopt.persistent);
  EXPECT_LT(zero3.persistent, zero2.persistent);
  EXPECT_LE(zero3.persistent, lz.persistent);
  // Model state per element: plain 4 (value) + 4 (gradient) + 8 (Adam); distributed optimizer
  // 4 + 4 + 8/dp; ZeRO-3 (4 + 4 + 8)/dp. What ZeRO-3 saves over the distributed optimizer
  // persistently is at least 8·n·(1 − 1/dp) minus a padding element per unit and rank.
  EXPECT_LT(zero3.persistent, distopt.persistent);
  EXPECT_LT(distopt.persistent, plain.persistent);
  EXPECT_GE(distopt.persistent - zero3.persistent, 8 * n - 8 * n / dp - 8 * 16 * dp);
  EXPECT_LT(zero3.step_peak, distopt.step_peak);
  EXPECT_LT(distopt.step_peak, plain.step_peak);
  // The transient part of a ZeRO-3 step: activations, the gathered units and one reduce-scatter's
  // staging, far below the whole model's values.
  EXPECT_LT(zero3.step_peak - zero3.persistent, 4 * n);
  if (world->rank() == 0)
    std::printf("DP%lld: ZeRO-2 %lld / %lld, LayerZeRO zero3_size 2: %lld / %lld\n", static_cast<long long>(dp),
                static_cast<long long>(zero2.persistent), static_cast<long long>(zero2.step_peak),
                static_cast<long long>(lz.persistent), static_cast<long long>(lz.step_peak));
  if (world->rank() == 0)
    std::printf("DP%lld, %lld parameters, bytes per rank (persistent after 2 iterations / step peak / build peak): "
                "plain DP %lld / %lld / %lld, distributed optimizer %lld / %lld / %lld, ZeRO-3 %lld / %lld / %lld\n",
                static_cast<long long>(dp), static_cast<long long>(n), static_cast<long long>(plain.persistent),
                static_cast<long long>(plain.step_peak), static_cast<long long>(plain.build_peak),
                static_cast<long long>(distopt.persistent), static_cast<long long>(distopt.step_peak),
                static_cast<long long>(distopt.build_peak), static_cast<long long>(zero3.persistent),
                static_cast<long long>(zero3.step_peak), static_cast<long long>(zero3.build_peak));
}

std::string shared_temp_dir(const Comm& world, const std::string& name) {
  int64_t pid = world->rank() == 0 ? static_cast<int64_t>(::getpid()) : 0;
  pid = world->all_reduce_scalar(pid, ReduceOp::kMax);
  return (std::filesystem::temp_directory_path() / ("gale_zero3_" + name + "_" + std::to_string(pid))).string();
}

TEST(Zero3, CheckpointsKeepTheCommonFormat) {
  Comm world = test::world();
  if (world->size() == 1) GTEST_SKIP() << "needs data parallelism";
  const std::string dir = shared_temp_dir(world, "ckpt");
  if (world->rank() == 0) std::filesystem::remove_all(dir);
  world->barrier();
  Zero3Run plain(world, testing::kTinyGpt, {});
  const std::vector<double> expected = plain.train(6);
  std::vector<double> uninterrupted;
  {
    Zero3Run first(world, testing::kTinyGpt, testing::join({kZero3, {"--save", dir, "--save-interval", "3"}}));
    first.train(3);
    ASSERT_TRUE(first.save().ok());
    uninterrupted = first.train(3);
  }
  world->barrier();
  auto resume = [&](const Comm& group, const std::vector<std::string>& flags, const char* what) {
    Zero3Run r(group, testing::kTinyGpt, testing::join({flags, {"--load", dir}}));
    const Status st = r.load();
    EXPECT_TRUE(st.ok()) << what << ": " << st.to_string();
    if (!st.ok()) return std::vector<double>{};
    EXPECT_EQ(r.trainer->state().iteration, 3) << what;
    const std::vector<double> losses = r.train(3);
    for (int i = 0; i < 3; ++i)
      EXPECT_NEAR(losses[i], expected[3 + i], 1e-5 * expected[3 + i]) << what << ", loss of iteration " << 4 + i;
    return losses;
  };
  const std::vector<double> again = resume(world, kZero3, "ZeRO-3, same layout");
  ASSERT_EQ(again.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(again[i], uninterrupted[i]) << "ZeRO-3 resumed at its own layout";
  resume(world, {}, "plain data parallelism");
  resume(world, {"--use-distributed-optimizer"}, "distributed optimizer");
  resume(make_self_communicator("world"), {}, "one process");
  resume(world, kZero2, "ZeRO-2");
  resume(world, layerzero(world, 2), "LayerZeRO zero3_size 2");
  world->barrier();
  if (world->rank() == 0) std::filesystem::remove_all(dir);
}

// A LayerZeRO checkpoint (its optimizer state in pieces over the whole DP group) and a ZeRO-2 one
// resume with themselves bit for bit and with plain data parallelism.
TEST(Zero3, LayerZeroAndZero2CheckpointsResume) {
  Comm world = test::world();
  if (world->size() == 1) GTEST_SKIP() << "needs data parallelism";
  Zero3Run plain(world, testing::kTinyGpt, {});
  const std::vector<double> expected = plain.train(6);
  for (const std::vector<std::string>& flags : {layerzero(world, 1), kZero2}) {
    const std::string dir = shared_temp_dir(world, flags[0] == "--layerzero" ? "lz" : "z2");
    if (world->rank() == 0) std::filesystem::remove_all(dir);
    world->barrier();
    std::vector<double> uninterrupted;
    {
      Zero3Run first(world, testing::kTinyGpt, testing::join({flags, {"--save", dir, "--save-interval", "3"}}));
      first.train(3);
      ASSERT_TRUE(first.save().ok());
      uninterrupted = first.train(3);
    }
    world->barrier();
    for (const std::vector<std::string>& resumed : {flags, std::vector<std::string>{}}) {
      Zero3Run r(world, testing::kTinyGpt, testing::join({resumed, {"--load", dir}}));
      ASSERT_TRUE(r.load().ok()) << flags[0];
      const std::vector<double> losses = r.train(3);
      for (int i = 0; i < 3; ++i) {
        EXPECT_NEAR(losses[i], expected[3 + i], 1e-5 * expected[3 + i]) << flags[0] << ", iteration " << 4 + i;
        if (!resumed.empty()) {
          EXPECT_EQ(losses[i], uninterrupted[i]) << flags[0] << " resumed at its own layout";
        }
      }
    }
    world->barrier();
    if (world->rank() == 0) std::filesystem::remove_all(dir);
  }
}

}  // namespace
}  // namespace gale
