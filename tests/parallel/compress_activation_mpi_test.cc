// --compress-activation and --compress-dense under pipeline parallelism (mpirun -np 2): with 1F1B
// and with the interleaved schedule several micro-batches' forwards are in flight on a stage, each
// with its own compressed layers, and the listed 1-based layer numbers are global (layers 2-3 span
// both stages); training is the run without the flags', bit for bit, and each stage compressed
// exactly its listed layers.
#include <gtest/gtest.h>

#include <cstring>

#include "mpi_test_env.h"
#include "testing_run.h"
#include "train/grad_sync.h"

namespace gale {
namespace {

struct Result {
  std::vector<double> losses;
  std::vector<uint32_t> values;
  int64_t tensors = 0;  // compressed on this rank
};

Result train(const Comm& world, const std::vector<std::string>& extra) {
  testing::TestRun run(testing::join({{"--num-layers", "4", "--hidden-size", "64", "--seq-length", "32",
                                       "--max-position-embeddings", "32", "--micro-batch-size", "1",
                                       "--global-batch-size", "6", "--train-iters", "3", "--lr", "5e-3", "--mock-data",
                                       "--make-vocab-size-divisible-by", "64", "--hidden-dropout", "0.1",
                                       "--attention-dropout", "0.1", "--eval-iters", "0", "--log-interval", "1000",
                                       "--pipeline-model-parallel-size", "2"},
                                      testing::kTinyGpt, extra}),
                       world, testing::kTinyVocab);
  Result r;
  r.losses = run.train(3);
  finish_param_sync(*run.engine);
  for (const auto& chunk : run.engine->chunks) {
    const Tensor& p = chunk->params().flat_params();
    const size_t at = r.values.size();
    r.values.resize(at + static_cast<size_t>(p.numel()));
    std::memcpy(r.values.data() + at, p.data<float>(), static_cast<size_t>(p.numel()) * sizeof(float));
    r.tensors += chunk->activation_compress_stats().tensors;
  }
  return r;
}

TEST(CompressActivationPipeline, ForwardsInFlightCompressBitIdentically) {
  Comm world = test::world();
  if (world->size() != 2) GTEST_SKIP() << "needs PP2";
  for (const std::vector<std::string>& schedule :
       {std::vector<std::string>{}, {"--num-virtual-stages-per-pipeline-rank", "2"}}) {
    const Result plain = train(world, schedule);
    int64_t all = 0;
    for (const std::vector<std::string>& flags :
         {std::vector<std::string>{"--compress-activation", "0"}, {"--compress-activation", "2-3"},
          {"--compress-activation", "1"}, {"--compress-dense", "level0"}, {"--compress-dense", "level1"}}) {
      const Result packed = train(world, testing::join({schedule, flags}));
      const std::string what = flags[0] + " " + flags[1] + (schedule.empty() ? " 1F1B" : " interleaved");
      for (size_t i = 0; i < plain.losses.size(); ++i) EXPECT_EQ(plain.losses[i], packed.losses[i]) << what;
      EXPECT_EQ(plain.values, packed.values) << what;
      // 18 micro-batch forwards per rank (3 iterations x 6); each compressed layer keeps the same
      // tensors, so the counts are proportional to the layers compressed on this rank.
      if (flags[1] == "0") all = packed.tensors;
      if (flags[1] == "0") EXPECT_GT(packed.tensors, 0) << what;
      if (flags[1] == "2-3") EXPECT_EQ(packed.tensors * 2, all) << what;  // one of this rank's two layers
      if (flags[1] == "1") EXPECT_EQ(packed.tensors, world->rank() == 0 ? all / 2 : 0) << what;  // rank 0 holds it
    }
  }
}

}  // namespace
}  // namespace gale
