// PyTorch FSDP2 (--use-torch-fsdp2 --fsdp2-config-path, optim/zero3_sync.h) in whole training runs
// under mpirun at DP 2 and 4: the losses, gradient norms and updated parameters of plain data
// parallelism (gradient accumulation over several micro-batches per rank), for Megatron's flag alone
// and for HSDP (sharding_size 2 at DP 4); reshard_after_forward false, num_to_forward_prefetch and
// other wrap sets bitwise equal to the default; the exact bytes of gathered units each schedule
// holds at its peak; checkpoints of an HSDP run resumed by plain data parallelism.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/allocator.h"
#include "mpi_test_env.h"
#include "zero3_testing.h"
#include "train/checkpointing.h"

namespace gale {
namespace {

using testing::shard_vs_replicated;

// FSDP2 runs the ZeRO-3 tests' model.
using Fsdp2Run = testing::Zero3Run;

// The GPT shape with untied embeddings (FSDP2 requires them, as Megatron) and the LLaMA shape.
const std::vector<std::string> kGptUntied = testing::join({testing::kTinyGpt, {"--untie-embeddings-and-output-weights"}});


// `flags` against plain data parallelism on the same ranks, GPT (untied) and LLaMA: 5 iterations
// of 8 micro-batches of one sample. `replicas`: the HSDP replica count (1: whole-DP sharding).
void expect_trains_as_plain(const Comm& world, const std::vector<std::string>& flags, const std::string& label,
                            int64_t replicas) {
  for (const auto* model : {&kGptUntied, &testing::kTinyLlama}) {
    const std::string what = label + (model == &kGptUntied ? ", GPT" : ", LLaMA");
    Fsdp2Run plain(world, *model, {});
    Fsdp2Run z(world, *model, flags);
    ASSERT_EQ(z.engine->zero3.size(), 1u) << what;
    const ParamBuffer& pb = z.model().params();
    ASSERT_TRUE(pb.sharded() && pb.values_sharded()) << what;
    EXPECT_EQ(pb.num_units(), 3 + 2);  // embedding, 3 layers, head
    plain.train(5);
    z.train(5);
    for (int i = 0; i < 5; ++i) {
      EXPECT_NEAR(z.losses[i], plain.losses[i], 1e-6 * plain.losses[i]) << what << ", loss of iteration " << i + 1;
      EXPECT_NEAR(z.grad_norms[i], plain.grad_norms[i], 1e-5 * plain.grad_norms[i])
          << what << ", grad norm of iteration " << i + 1;
    }
    EXPECT_LT(shard_vs_replicated(pb, plain.model().params()), 1e-5) << what;
    EXPECT_EQ(z.engine->zero3[0]->gathered_units(), 0) << what;
    // What the optimizers update tiles the model once per replica.
    int64_t owned = 0;
    for (const FlatRange& r : z.engine->zero3[0]->owned_ranges()) owned += r.size();
    EXPECT_EQ(world->all_reduce_scalar(owned), pb.numel() * replicas) << what;
    EXPECT_EQ(z.engine->zero3[0]->shard_group_size(), world->size() / replicas) << what;
  }
}

TEST(Fsdp2, MegatronFlagAloneTrainsAsPlainDataParallelism) {
  Comm world = test::world();
  if (world->size() == 1) GTEST_SKIP() << "needs data parallelism";
  expect_trains_as_plain(world, testing::fsdp2_flags(""), "--use-torch-fsdp2", 1);
}

// recompute_modules [layers]: each layer reruns its forward in its backward, while gathered.
TEST(Fsdp2, RecomputedLayersTrainAsPlainDataParallelism) {
  Comm world = test::world();
  if (world->size() == 1) GTEST_SKIP() << "needs data parallelism";
  expect_trains_as_plain(world, testing::fsdp2_flags("recompute_modules:\n  - layers\nnum_to_forward_prefetch: 1\n"),
                         "recompute_modules layers", 1);
}

TEST(Fsdp2, HsdpShardingSize2TrainsAsPlainDataParallelism) {
  Comm world = test::world();
  if (world->size() < 4) GTEST_SKIP() << "needs DP 4";
  expect_trains_as_plain(world, testing::fsdp2_flags("sharding_size: 2\n"), "sharding_size 2", world->size() / 2);
}

// One schedule's run: its losses, gradient norms and final shard bytes, and its peak gathered bytes.
struct Outcome {
  std::vector<double> losses, grad_norms;
  std::vector<float> shards;
  int64_t peak_gathered = 0, prefetched = 0;
  int max_units = 0;
  std::vector<int64_t> unit_bytes;  // 8 · padded: whole values and gradients of each unit
};

Outcome run_schedule(const Comm& world, const std::string& yaml) {
  Fsdp2Run r(world, testing::kTinyLlama, testing::fsdp2_flags(yaml));
  r.train(4);
  Outcome o;
  o.losses = r.losses;
  o.grad_norms = r.grad_norms;
  const ParamBuffer& pb = r.model().params();
  for (int u = 0; u < pb.num_units(); ++u) {
    const ParamUnit& x = pb.unit(u);
    o.shards.insert(o.shards.end(), pb.shard_values(u), pb.shard_values(u) + (x.own_end - x.own_begin));
    o.unit_bytes.push_back(8 * x.padded);
  }
  o.peak_gathered = r.engine->zero3[0]->max_gathered_bytes();
  o.prefetched = r.engine->zero3[0]->prefetched();
  o.max_units = r.engine->zero3[0]->max_gathered_units();
  return o;
}

void expect_bitwise(const Outcome& a, const Outcome& b, const std::string& what) {
  ASSERT_EQ(a.losses.size(), b.losses.size()) << what;
  for (size_t i = 0; i < a.losses.size(); ++i) {
    EXPECT_EQ(a.losses[i], b.losses[i]) << what << ", loss of iteration " << i + 1;
    EXPECT_EQ(a.grad_norms[i], b.grad_norms[i]) << what << ", grad norm of iteration " << i + 1;
  }
  ASSERT_EQ(a.shards.size(), b.shards.size()) << what;
  EXPECT_EQ(std::memcmp(a.shards.data(), b.shards.data(), a.shards.size() * sizeof(float)), 0)
      << what << ": the updated shards differ";
}

// Units: 0 embedding, 1..3 layers, 4 head. The default keeps the head (root) from the forward's
// start to the backward's end and one wrapped unit beside it; reshard_after_forward false keeps
// every unit from its forward to its backward; a prefetch of n adds the values (4 · padded) of up
// to n next wrapped units in flight.
TEST(Fsdp2, SchedulesAreBitwiseEqualAndHoldTheirBytes) {
  Comm world = test::world();
  if (world->size() == 1) GTEST_SKIP() << "needs data parallelism";
  const Outcome def = run_schedule(world, "");
  const std::vector<int64_t>& g = def.unit_bytes;
  ASSERT_EQ(g.size(), 5u);
  const int64_t wrapped_max = std::max({g[0], g[1], g[2], g[3]});
  EXPECT_EQ(def.peak_gathered, g[4] + wrapped_max);
  EXPECT_EQ(def.max_units, 2);
  EXPECT_EQ(def.prefetched, 0);

  const Outcome keep = run_schedule(world, "reshard_after_forward: false\n");
  expect_bitwise(def, keep, "reshard_after_forward false");
  EXPECT_EQ(keep.peak_gathered, g[0] + g[1] + g[2] + g[3] + g[4]);
  EXPECT_EQ(keep.max_units, 5);

  int64_t expected_prefetch_peak = 0;  // unit u gathered, u+1 in flight (values only), head gathered
  for (int u = 0; u < 4; ++u) expected_prefetch_peak = std::max(expected_prefetch_peak, g[4] + g[u] + (u < 3 ? g[u + 1] / 2 : 0));
  const Outcome pre1 = run_schedule(world, "num_to_forward_prefetch: 1\n");
  expect_bitwise(def, pre1, "num_to_forward_prefetch 1");
  EXPECT_EQ(pre1.peak_gathered, expected_prefetch_peak);
  // Each micro-batch (4 iterations × 8/dp) prefetches layers 0, 1, 2 (the head is the root).
  EXPECT_EQ(pre1.prefetched, 4 * (8 / world->size()) * 3);
  const Outcome pre2 = run_schedule(world, "num_to_forward_prefetch: 2\nreshard_after_forward: false\n");
  expect_bitwise(def, pre2, "num_to_forward_prefetch 2, reshard_after_forward false");

  const Outcome recompute = run_schedule(world, "recompute_modules:\n  - layers\n");
  expect_bitwise(def, recompute, "recompute_modules layers");
  EXPECT_EQ(recompute.peak_gathered, def.peak_gathered);

  // Wrapping the head too (no root) and leaving the layers in the root: the same training.
  const Outcome head = run_schedule(world, "sub_modules_to_wrap:\n  - embedding\n  - layers\n  - head\n");
  expect_bitwise(def, head, "head wrapped");
  EXPECT_EQ(head.peak_gathered, std::max({g[0], g[1], g[2], g[3], g[4]}));
  const Outcome root_layers = run_schedule(world, "sub_modules_to_wrap:\n  - embedding\n");
  expect_bitwise(def, root_layers, "layers and head in the root");
  EXPECT_EQ(root_layers.peak_gathered, g[0] + g[1] + g[2] + g[3] + g[4]);

  if (world->rank() == 0)
    std::printf("DP%d, unit bytes (values + gradients) %lld %lld %lld %lld %lld; peak gathered bytes: default %lld, "
                "reshard_after_forward false %lld, prefetch 1 %lld, head wrapped %lld, layers in the root %lld\n",
                world->size(), static_cast<long long>(g[0]), static_cast<long long>(g[1]),
                static_cast<long long>(g[2]), static_cast<long long>(g[3]), static_cast<long long>(g[4]),
                static_cast<long long>(def.peak_gathered), static_cast<long long>(keep.peak_gathered),
                static_cast<long long>(pre1.peak_gathered), static_cast<long long>(head.peak_gathered),
                static_cast<long long>(root_layers.peak_gathered));
}

// Exact bytes (the allocator's counters) a rank holds above what the process held before building
// the run, for a larger model (4 layers, hidden 128): after two iterations (persistent) and the
// peak during a third; and the Zero3Sync's own peak of gathered bytes.
struct Bytes {
  int64_t persistent = 0, step_peak = 0, gathered_peak = 0;
};

Bytes measure(const Comm& world, const std::vector<std::string>& flags) {
  const int64_t base = host_allocator().current_bytes();
  Bytes b;
  {
    Fsdp2Run run(world, testing::kTinyLlama, testing::join({{"--num-layers", "4", "--hidden-size", "128"}, flags}));
    run.train(2);
    b.persistent = host_allocator().current_bytes() - base;
    host_allocator().reset_peak();
    if (!run.engine->zero3.empty()) run.engine->zero3[0]->reset_peak();
    run.train(1);
    b.step_peak = host_allocator().peak_bytes() - base;
    if (!run.engine->zero3.empty()) b.gathered_peak = run.engine->zero3[0]->max_gathered_bytes();
  }
  return b;
}

TEST(Fsdp2, BytesPerRank) {
  Comm world = test::world();
  if (world->size() == 1) GTEST_SKIP() << "needs data parallelism";
  const Bytes plain = measure(world, {});
  const Bytes def = measure(world, testing::fsdp2_flags(""));
  const Bytes keep = measure(world, testing::fsdp2_flags("reshard_after_forward: false\n"));
  const Bytes pre = measure(world, testing::fsdp2_flags("num_to_forward_prefetch: 1\n"));
  const Bytes wrap_all = measure(world, testing::fsdp2_flags("sub_modules_to_wrap:\n  - embedding\n  - layers\n  - head\n"));
  // The schedules change only what is gathered during a step: the same persistent shards.
  EXPECT_EQ(keep.persistent, def.persistent);
  EXPECT_EQ(pre.persistent, def.persistent);
  EXPECT_EQ(wrap_all.persistent, def.persistent);
  EXPECT_LT(def.persistent, plain.persistent);
  EXPECT_LT(def.step_peak, plain.step_peak);
  EXPECT_GT(keep.gathered_peak, def.gathered_peak);
  EXPECT_GT(pre.gathered_peak, def.gathered_peak);
  EXPECT_LT(wrap_all.gathered_peak, def.gathered_peak);
  EXPECT_GT(keep.step_peak, def.step_peak);
  // Exact accounting: a schedule's step peak moves by exactly its change in gathered bytes (the
  // activations and everything else at the peak are the same). With a prefetch in flight the peak
  // also holds the all-gather's small bookkeeping (measured: 0 or 64 bytes by rank).
  EXPECT_EQ(keep.step_peak - def.step_peak, keep.gathered_peak - def.gathered_peak);
  EXPECT_EQ(wrap_all.step_peak - def.step_peak, wrap_all.gathered_peak - def.gathered_peak);
  EXPECT_NEAR(static_cast<double>(pre.step_peak - def.step_peak),
              static_cast<double>(pre.gathered_peak - def.gathered_peak), 256.0);
  Bytes hsdp;
  if (world->size() >= 4) {
    hsdp = measure(world, testing::fsdp2_flags("sharding_size: 2\n"));
    EXPECT_GT(hsdp.persistent, def.persistent);  // shards of DP/2 ranks, the optimizer state on each replica
  }
  if (world->rank() == 0) {
    auto row = [](const char* name, const Bytes& b) {
      std::printf("  %-34s persistent %9lld  step peak %9lld  gathered peak %9lld\n", name,
                  static_cast<long long>(b.persistent), static_cast<long long>(b.step_peak),
                  static_cast<long long>(b.gathered_peak));
    };
    std::printf("DP%d, bytes per rank (4 layers, hidden 128):\n", world->size());
    row("plain DP", plain);
    row("--use-torch-fsdp2 (defaults)", def);
    row("reshard_after_forward: false", keep);
    row("num_to_forward_prefetch: 1", pre);
    row("head wrapped too (no root)", wrap_all);
    if (world->size() >= 4) row("sharding_size: 2 (HSDP)", hsdp);
  }
}

std::string shared_temp_dir(const Comm& world, const std::string& name) {
  int64_t pid = world->rank() == 0 ? static_cast<int64_t>(::getpid()) : 0;
  pid = world->all_reduce_scalar(pid, ReduceOp::kMax);
  return (std::filesystem::temp_directory_path() / ("gale_fsdp2_" + name + "_" + std::to_string(pid))).string();
}

// A checkpoint of FSDP2 (HSDP at DP 4: the first replica writes the optimizer state) resumes bit for
// bit at its own layout and within tolerance with plain data parallelism.
TEST(Fsdp2, CheckpointsResume) {
  Comm world = test::world();
  if (world->size() == 1) GTEST_SKIP() << "needs data parallelism";
  const std::vector<std::string> flags = testing::fsdp2_flags(world->size() >= 4 ? "sharding_size: 2\n" : "");
  Fsdp2Run plain(world, testing::kTinyLlama, {});
  const std::vector<double> expected = plain.train(6);
  const std::string dir = shared_temp_dir(world, "ckpt");
  if (world->rank() == 0) std::filesystem::remove_all(dir);
  world->barrier();
  std::vector<double> uninterrupted;
  {
    Fsdp2Run first(world, testing::kTinyLlama, testing::join({flags, {"--save", dir, "--save-interval", "3"}}));
    first.train(3);
    ASSERT_TRUE(save_checkpoint(first.args, *first.engine, first.trainer->state()).ok());
    uninterrupted = first.train(3);
  }
  world->barrier();
  for (const std::vector<std::string>& resumed : {flags, std::vector<std::string>{}}) {
    Fsdp2Run r(world, testing::kTinyLlama, testing::join({resumed, {"--load", dir}}));
    bool loaded = false;
    ASSERT_TRUE(load_checkpoint(r.args, *r.engine, r.trainer->state(), &loaded).ok());
    ASSERT_TRUE(loaded);
    const std::vector<double> losses = r.train(3);
    for (int i = 0; i < 3; ++i) {
      EXPECT_NEAR(losses[i], expected[3 + i], 1e-5 * expected[3 + i]) << "iteration " << 4 + i;
      if (!resumed.empty()) EXPECT_EQ(losses[i], uninterrupted[i]) << "resumed at its own layout, iteration " << 4 + i;
    }
  }
  world->barrier();
  if (world->rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace gale
