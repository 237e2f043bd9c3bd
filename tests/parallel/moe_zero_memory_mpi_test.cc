// --moe-alltoall-overlap-comm and --moe-zero-memory level0|level1 under expert parallelism (EP2 on
// 2 ranks; TP2+SP with expert TP 2 × EP2 on 4 ranks), alltoall dispatcher, gated shared expert:
// every rank's losses, grad norms, parameters and gradients after 3 steps are bit-identical to the
// same layout without the flags (the flags go through the real feature registry).
#include <gtest/gtest.h>


#include "features/resolved_features.h"
#include "mpi_test_env.h"
#include "testing_bitwise.h"
#include "testing_run.h"
#include "train/grad_sync.h"

namespace gale {
namespace {

// A tiny Mixtral with a shared expert (testing_run.h).
const std::vector<std::string> kMoe = testing::tiny_mixtral_flags(4, "alltoall");

std::vector<std::string> layout_flags(int world) {
  if (world == 2) return {"--expert-model-parallel-size", "2"};
  return {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--expert-model-parallel-size", "2"};
}

// The run of kMoe + the layout with `feature_flags` resolved by the registry (ops and recompute plan).
std::unique_ptr<testing::TestRun> train(const std::vector<std::string>& feature_flags) {
  Comm world = test::world();
  const std::vector<std::string> flags = testing::join({kMoe, layout_flags(world->size())});
  ResolvedFeatures r(testing::join({flags, feature_flags}));
  GALE_CHECK_OK(r.status);
  auto run = std::make_unique<testing::TestRun>(flags, world, testing::kTinyVocab, EngineOptions{0, r.recompute}, r.ops);
  run->train(3);
  finish_param_sync(*run->engine);
  return run;
}

TEST(MoeZeroMemoryMpi, OverlapAndZeroMemoryAreBitIdentical) {
  if (test::world()->size() != 2 && test::world()->size() != 4) GTEST_SKIP() << "needs 2 or 4 ranks";
  const auto plain = train({});
  EXPECT_GT(plain->engine->chunks[0]->params().numel(), 0);
  const std::vector<std::string> overlap = {"--moe-alltoall-overlap-comm"};
  testing::expect_runs_bit_identical(*train(overlap), *plain, "overlap");
  testing::expect_runs_bit_identical(*train(testing::join({overlap, {"--moe-zero-memory", "level0"}})), *plain, "level0");
  testing::expect_runs_bit_identical(*train(testing::join({overlap, {"--moe-zero-memory", "level1"}})), *plain, "level1");
  testing::expect_runs_bit_identical(
      *train(testing::join({overlap, {"--moe-zero-memory", "level1", "--moe-zero-memory-num-layers", "1"}})), *plain,
      "level1 in layer 0, level0 in layers 1 and 3");
}

}  // namespace
}  // namespace gale
