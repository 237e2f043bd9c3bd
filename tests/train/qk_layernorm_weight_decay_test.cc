// --apply-wd-to-qk-layernorm (and its deprecated spelling --no-weight-decay-cond-type
// apply_wd_to_qk_layernorm): which parameters decay (Megatron main's name match), that training
// really decays the q/k layernorm weights and nothing else changes, and the flags' parsing.
#include <gtest/gtest.h>

#include "pretrain_cli.h"
#include "testing_run.h"
#include "train/engine.h"

namespace gale {
namespace {

const std::vector<std::string> kFlags = {"--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
                                         "--seq-length", "16", "--max-position-embeddings", "16",
                                         "--micro-batch-size", "2", "--global-batch-size", "4", "--lr", "1e-2",
                                         "--mock-data", "--eval-iters", "0", "--train-iters", "2", "--qk-layernorm",
                                         "--weight-decay", "0.5", "--normalization", "RMSNorm"};
constexpr int64_t kVocab = 250;

TEST(QkLayernormWeightDecay, MarksTheQkNormsAndKeepsMegatronsRuleElsewhere) {
  testing::TestRun run(kFlags, make_self_communicator("world"), kVocab);
  const GPTModel& model = *run.engine->chunks.front();
  const std::vector<bool> decay = qk_layernorm_weight_decay(model);
  const ParamBuffer& pb = model.params();
  ASSERT_EQ(decay.size(), static_cast<size_t>(pb.size()));
  int qk = 0;
  for (int id = 0; id < pb.size(); ++id) {
    const std::string& n = pb.spec(id).name;
    const bool is_qk = n.find("self_attention.q_layernorm.") != std::string::npos ||
                       n.find("self_attention.k_layernorm.") != std::string::npos;
    qk += is_qk;
    EXPECT_EQ(decay[static_cast<size_t>(id)], is_qk || pb.spec(id).weight_decay) << n;
    if (is_qk) {
      EXPECT_FALSE(pb.spec(id).weight_decay) << n;  // 1-D: no decay by default
    }
  }
  EXPECT_EQ(qk, 4);  // q and k norms of 2 layers
}

// One step each, the same data: the q/k layernorm weights differ (decayed), every other parameter
// is equal bit for bit.
TEST(QkLayernormWeightDecay, TrainingDecaysOnlyTheQkNorms) {
  testing::TestRun plain(kFlags, make_self_communicator("world"), kVocab);
  testing::TestRun with(testing::join({kFlags, {"--apply-wd-to-qk-layernorm"}}), make_self_communicator("world"),
                        kVocab);
  plain.train(1);
  with.train(1);
  const ParamBuffer& a = plain.engine->chunks.front()->params();
  const ParamBuffer& b = with.engine->chunks.front()->params();
  for (int id = 0; id < a.size(); ++id) {
    const std::string& n = a.spec(id).name;
    const bool is_qk = n.find("q_layernorm.") != std::string::npos || n.find("k_layernorm.") != std::string::npos;
    const Tensor x = a.param_values(id), y = b.param_values(id);
    int64_t differ = 0;
    for (int64_t i = 0; i < x.numel(); ++i) differ += x.data<float>()[i] != y.data<float>()[i];
    if (is_qk)
      EXPECT_EQ(differ, x.numel()) << n;  // every element decayed (weights start at 1)
    else
      EXPECT_EQ(differ, 0) << n;
  }
}

TEST(QkLayernormWeightDecay, DeprecatedSpellingSetsTheFlag) {
  testing::PretrainCli c;
  ASSERT_TRUE(c.parse_minimal({"--no-weight-decay-cond-type", "apply_wd_to_qk_layernorm"}).ok());
  EXPECT_TRUE(c.args.training.apply_wd_to_qk_layernorm);
  testing::PretrainCli d;
  ASSERT_TRUE(d.parse_minimal({}).ok());
  EXPECT_FALSE(d.args.training.apply_wd_to_qk_layernorm);
  testing::expect_one_line_error({{"--no-weight-decay-cond-type", "qwen3_next"}, 1, "--no-weight-decay-cond-type"});
}

}  // namespace
}  // namespace gale
