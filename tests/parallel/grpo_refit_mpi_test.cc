// GRPO's rollout model (train/grpo_refit.h): the refit whole-model copy of a TP 2 (+SP,
// --unaligned-linear), PP 2 or TP 2 × EP 2 (MoE) GPT / LLaMA policy equals the single-process model bit for bit at
// initialisation (layout-independent init) and, after training steps, holds every TP shard's
// values at their global positions; the rollout-token check passes equal tokens and stops on
// tokens that differ between the ranks.
#include <gtest/gtest.h>

#include "mpi_test_env.h"
#include "testing_run.h"
#include "train/grpo_refit.h"

namespace gale {
namespace {

const std::vector<std::string> kCommon = {
    "--num-layers", "2", "--hidden-size", "64", "--seq-length", "16", "--max-position-embeddings", "16",
    "--micro-batch-size", "2", "--global-batch-size", "4", "--lr", "1e-2", "--train-iters", "2", "--mock-data",
    "--make-vocab-size-divisible-by", "64", "--hidden-dropout", "0", "--attention-dropout", "0", "--eval-iters", "0",
    "--log-interval", "1000"};

struct Case {
  const char* name;
  std::vector<std::string> flags;
  std::vector<std::string> layout = {"--tensor-model-parallel-size", "2"};
};

class GrpoRefit : public ::testing::TestWithParam<Case> {};

TEST_P(GrpoRefit, WholeCopyHoldsEveryShardAtItsGlobalPosition) {
  Comm world = test::world();
  if (world->size() != 2) GTEST_SKIP() << "needs 2 ranks";
  const std::vector<std::string> model = testing::join({kCommon, GetParam().flags});
  testing::TestRun whole(model, make_self_communicator("world"), testing::kTinyVocab);
  testing::TestRun tp(testing::join({model, GetParam().layout}), world, testing::kTinyVocab);
  GrpoRolloutModel rollout({&tp.model()}, world, &tp.engine->ops);
  ASSERT_TRUE(rollout.is_copy());
  ASSERT_TRUE(rollout.refit().ok());
  const ParamBuffer& copy = rollout.model().params();
  const ParamBuffer& ref = whole.model().params();
  ASSERT_EQ(copy.size(), ref.size());
  for (int id = 0; id < copy.size(); ++id) {
    const ParamSpec& s = copy.spec(id);
    ASSERT_EQ(s.name, ref.spec(id).name);
    ASSERT_EQ(s.local_numel(), ref.spec(id).local_numel()) << s.name;
    for (int64_t i = 0; i < s.local_numel(); ++i)
      ASSERT_EQ(copy.param_data(id)[i], ref.param_data(id)[i]) << s.name << " element " << i;
  }
  // After two steps the shards moved (differently from the single-process run's rounding): the copy
  // holds this rank's values where its shard lies.
  tp.train(2);
  ASSERT_TRUE(rollout.refit().ok());
  const ParamBuffer& shards = tp.model().params();
  int64_t moved = 0;
  for (int id = 0; id < shards.size(); ++id) {
    const ParamSpec& s = shards.spec(id);
    const int cid = copy.find(s.whole_model_name());
    ASSERT_GE(cid, 0) << s.name;
    for (int64_t i = 0; i < s.local_numel(); ++i) {
      const float v = shards.param_data(id)[i];
      ASSERT_EQ(copy.param_data(cid)[s.global_index(i)], v) << s.name << " local element " << i;
      moved += v != ref.param_data(cid)[s.global_index(i)];
    }
  }
  EXPECT_GT(moved, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Models, GrpoRefit,
    ::testing::Values(Case{"gpt", testing::kTinyGpt},
                      Case{"llama_sp", testing::join({testing::kTinyLlama, {"--sequence-parallel"}})},
                      Case{"gpt_unaligned", {"--num-attention-heads", "5", "--kv-channels", "16", "--ffn-hidden-size", "200", "--unaligned-linear"}},
                      // PP 2: each stage's layers, the tied embedding written once (the first stage's).
                      Case{"gpt_pp2", testing::kTinyGpt, {"--pipeline-model-parallel-size", "2"}},
                      Case{"llama_pp2", testing::kTinyLlama, {"--pipeline-model-parallel-size", "2"}},
                      // MoE: TP 2 dense, EP 2 with whole experts (ETP 1): each rank's experts under their
                      // whole-model names.
                      Case{"moe_tp2_ep2",
                           testing::join({testing::kTinyLlama,
                                          {"--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "48",
                                           "--sequence-parallel"}}),
                           {"--tensor-model-parallel-size", "2", "--expert-model-parallel-size", "2",
                            "--expert-tensor-parallel-size", "1"}}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

TEST(GrpoRolloutCheck, EqualTokensPassDifferentTokensStop) {
  Comm world = test::world();
  if (world->size() != 2) GTEST_SKIP() << "needs 2 ranks";
  EXPECT_TRUE(check_same_rollouts({1, 2, 3, 4}, world).ok());
  const Status st = check_same_rollouts({1, 2, 3, 4 + world->rank()}, world);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("the ranks generated different rollouts"), std::string::npos) << st.message();
  EXPECT_TRUE(check_same_rollouts({1, 2, 3, 4 + world->rank()}, make_self_communicator("self")).ok());
}

}  // namespace
}  // namespace gale
