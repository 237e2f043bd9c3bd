// --smart-swap with data, tensor (+ sequence) and context parallelism (mpirun -np 2): each rank
// samples and plans on its own; training is the same layout's run without the flag, bit for bit,
// and each rank's allocator peak of the later iterations is its policy's prediction to the byte.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <unistd.h>

#include "core/allocator.h"
#include "mpi_test_env.h"
#include "testing_run.h"
#include "train/grad_sync.h"

namespace gale {
namespace {

struct Result {
  std::vector<double> losses;
  std::vector<uint32_t> values;
  int64_t stable_peak = 0, predicted_peak = 0, swapped_bytes = 0;
};

// 2 iterations (the second sampled with --smart-swap), then 2 measured.
Result train(const Comm& world, const std::vector<std::string>& extra) {
  testing::TestRun run(testing::join({{"--num-layers", "4", "--hidden-size", "64", "--seq-length", "16",
                                       "--max-position-embeddings", "16", "--micro-batch-size", "1",
                                       "--global-batch-size", "4", "--train-iters", "4", "--lr", "5e-3", "--mock-data",
                                       "--make-vocab-size-divisible-by", "64", "--hidden-dropout", "0.1",
                                       "--attention-dropout", "0.1", "--eval-iters", "0", "--log-interval", "1000"},
                                      testing::kTinyGpt, extra}),
                       world, testing::kTinyVocab);
  Result r;
  r.losses = run.train(2);
  Allocator& a = host_allocator();
  a.reset_peak();
  for (double l : run.train(2)) r.losses.push_back(l);
  r.stable_peak = a.peak_bytes();
  if (run.engine->smart_swap) {
    r.predicted_peak = run.engine->smart_swap->policy()->predicted_peak;
    r.swapped_bytes = run.engine->smart_swap->policy()->swapped_bytes;
  }
  finish_param_sync(*run.engine);
  const Tensor& p = run.engine->chunks.front()->params().flat_params();
  r.values.resize(static_cast<size_t>(p.numel()));
  std::memcpy(r.values.data(), p.data<float>(), r.values.size() * sizeof(float));
  return r;
}

TEST(SmartSwapParallel, EachRanksPolicyIsLosslessAndItsPeakAsPredicted) {
  Comm world = test::world();
  if (world->size() != 2) GTEST_SKIP() << "needs 2 ranks";
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("gale_smartswap_mpi_" + std::to_string(::getpid()))).string();
  std::filesystem::create_directories(dir);
  for (const std::vector<std::string>& layout : {std::vector<std::string>{},  // DP2
                                                 {"--tensor-model-parallel-size", "2", "--sequence-parallel"},
                                                 {"--context-parallel-size", "2"}}) {
    const std::string name = layout.empty() ? "DP2" : layout[0];
    const Result plain = train(world, layout);
    const Result smart = train(world, testing::join({layout, {"--smart-swap", "--swap-attention-dir", dir}}));
    EXPECT_EQ(plain.losses, smart.losses) << name;
    EXPECT_EQ(plain.values, smart.values) << name;
    EXPECT_GT(smart.swapped_bytes, 0) << name;
    EXPECT_EQ(smart.stable_peak, smart.predicted_peak) << name << " rank " << world->rank();
    EXPECT_LT(smart.stable_peak, plain.stable_peak) << name;
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir));
  world->barrier();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace gale
