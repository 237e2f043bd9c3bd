// --swap-attention and --swap-layer-input under pipeline parallelism (mpirun -np 2): with 1F1B and
// with the interleaved schedule several micro-batches' forwards are in flight on a stage, each with
// its own swap file (the second stage's first layer input is a received activation); training is
// the run without the flags', bit for bit.
#include <gtest/gtest.h>

#include <cstring>

#include "mpi_test_env.h"
#include "testing_run.h"
#include "train/grad_sync.h"

namespace gale {
namespace {

std::vector<double> train(const Comm& world, const std::vector<std::string>& extra, std::vector<uint32_t>* values) {
  testing::TestRun run(testing::join({{"--num-layers", "4", "--hidden-size", "64", "--seq-length", "16",
                                       "--max-position-embeddings", "16", "--micro-batch-size", "1",
                                       "--global-batch-size", "6", "--train-iters", "3", "--lr", "5e-3", "--mock-data",
                                       "--make-vocab-size-divisible-by", "64", "--hidden-dropout", "0.1",
                                       "--attention-dropout", "0.1", "--eval-iters", "0", "--log-interval", "1000",
                                       "--pipeline-model-parallel-size", "2"},
                                      testing::kTinyGpt, extra}),
                       world, testing::kTinyVocab);
  std::vector<double> losses = run.train(3);
  finish_param_sync(*run.engine);
  values->clear();
  for (const auto& chunk : run.engine->chunks) {
    const Tensor& p = chunk->params().flat_params();
    const size_t at = values->size();
    values->resize(at + static_cast<size_t>(p.numel()));
    std::memcpy(values->data() + at, p.data<float>(), static_cast<size_t>(p.numel()) * sizeof(float));
  }
  return losses;
}

TEST(SwapAttentionPipeline, ForwardsInFlightSwapBitIdentically) {
  Comm world = test::world();
  if (world->size() != 2) GTEST_SKIP() << "needs PP2";
  for (const std::vector<std::string>& schedule :
       {std::vector<std::string>{}, {"--num-virtual-stages-per-pipeline-rank", "2"}}) {
    std::vector<uint32_t> plain_values, swapped_values;
    const std::vector<double> a = train(world, schedule, &plain_values);
    for (const std::vector<std::string>& swap : {std::vector<std::string>{"--swap-attention"},
                                                 {"--swap-layer-input"}, {"--swap-attention", "--swap-layer-input"}}) {
      const std::vector<double> b = train(world, testing::join({schedule, swap}), &swapped_values);
      for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << swap.back() << " iteration " << i + 1;
      EXPECT_EQ(plain_values, swapped_values) << swap.size() << " " << swap.back() << " "
                                              << (schedule.empty() ? "1F1B" : "interleaved");
    }
  }
}

}  // namespace
}  // namespace gale
