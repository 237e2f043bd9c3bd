// --moe-allgather-overlap-comm under expert parallelism (EP2 on 2 ranks, also with the MoE
// recomputed in backward and tokens dropped at capacity 0.5; TP2+SP × EP2 with expert
// TP 2 and with expert TP 1 on 4 ranks), all-gather dispatcher, gated shared expert: every rank's
// losses, grad norms, parameters and gradients after 3 steps are bit-identical to the same layout
// without the flag (the flags go through the real feature registry).
#include <gtest/gtest.h>


#include "features/resolved_features.h"
#include "mpi_test_env.h"
#include "testing_bitwise.h"
#include "testing_run.h"
#include "train/grad_sync.h"

namespace gale {
namespace {

// A tiny Mixtral with a shared expert (testing_run.h).
const std::vector<std::string> kMoe = testing::tiny_mixtral_flags(4, "allgather");

std::vector<std::vector<std::string>> layouts(int world) {
  if (world == 2)
    return {{"--expert-model-parallel-size", "2"},
            // the MoE forward rerun in backward (with its all-gathers), and dropped tokens
            {"--expert-model-parallel-size", "2", "--recompute-granularity", "selective", "--recompute-modules", "moe",
             "--moe-expert-capacity-factor", "0.5", "--moe-token-drop-policy", "probs"}};
  return {{"--tensor-model-parallel-size", "2", "--sequence-parallel", "--expert-model-parallel-size", "2"},
          {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--expert-model-parallel-size", "2",
           "--expert-tensor-parallel-size", "1"}};
}

// The run of kMoe + `layout` with `feature_flags` resolved by the registry (ops and recompute plan).
std::unique_ptr<testing::TestRun> train(const std::vector<std::string>& layout,
                                        const std::vector<std::string>& feature_flags) {
  Comm world = test::world();
  const std::vector<std::string> flags = testing::join({kMoe, layout});
  ResolvedFeatures r(testing::join({flags, feature_flags}));
  GALE_CHECK_OK(r.status);
  EXPECT_EQ(r.ops.moe_allgather_overlap, !feature_flags.empty());
  auto run = std::make_unique<testing::TestRun>(flags, world, testing::kTinyVocab, EngineOptions{0, r.recompute}, r.ops);
  run->train(3);
  finish_param_sync(*run->engine);
  return run;
}

TEST(MoeAllgatherOverlapMpi, BitIdenticalToThePlainAllgatherDispatcher) {
  if (test::world()->size() != 2 && test::world()->size() != 4) GTEST_SKIP() << "needs 2 or 4 ranks";
  for (const std::vector<std::string>& layout : layouts(test::world()->size())) {
    std::string what;
    for (const std::string& w : layout) what += w + " ";
    const auto plain = train(layout, {});
    EXPECT_GT(plain->engine->chunks[0]->params().numel(), 0);
    EXPECT_EQ(plain->losses.size(), 3u);
    testing::expect_runs_bit_identical(*train(layout, {"--moe-allgather-overlap-comm"}), *plain, what);
  }
}

}  // namespace
}  // namespace gale
