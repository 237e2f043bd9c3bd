// Inference of a hybrid model with Gated DeltaNet layers ('G' beside Mamba, attention and MLP layers,
// M G * - G M): batched generation (train/inference_engine.h; each request's Mamba and GDN states in a
// slot of model/mamba_state.h) — static batches and dynamic batching — gives every request, at every
// step, the logits (within 1e-4 relative) of rerunning its whole sequence and greedy tokens that are
// the argmax of that training forward; `gale evaluate`'s scoring gives the training forward's loss.
#include <gtest/gtest.h>

#include "model/gdn_test_model.h"
#include "model/hybrid_test_model.h"
#include "train/engine_decoding_check.h"
#include "train/evaluate_check.h"
#include "train/inference_engine.h"

namespace gale {
namespace {

// tiny_hybrid_config's sizes with two 'G' layers sized as tiny_gdn_config's (as model_setup.cc fills
// ModelConfig::gdn from a hybrid pattern).
ModelConfig hybrid_gdn_config() {
  ModelConfig c = testing::tiny_hybrid_config();
  c.hybrid.layers = "MG*-GM";
  const ModelConfig g = testing::tiny_gdn_config();
  c.gdn = g.gdn;
  c.gdn.pattern = {0, 1, 0, 0, 1, 0};
  return c;
}

void make_states_carry(GPTModel& m) {
  testing::make_mamba_state_carry(m);
  testing::make_gdn_state_carry(m);
}

class HybridGdnEngineTest : public testing::EngineDecodingTest {
 protected:
  void SetUp() override { set_up(hybrid_gdn_config(), make_states_carry, {5, 1, 17, 40, 3, 12, 2, 9}); }
};

TEST_F(HybridGdnEngineTest, TheModelHasBothKindsOfRecurrentLayers) {
  EXPECT_TRUE(c_.hybrid.is_mamba_layer(0));
  EXPECT_TRUE(c_.gdn.is_gdn_layer(1));
  EXPECT_TRUE(c_.gdn.is_gdn_layer(4));
  EXPECT_GE(model_->params().find("decoder.layers.1.self_attention.in_proj.weight"), 0);
  EXPECT_GE(model_->params().find("decoder.layers.0.mixer.in_proj.weight"), 0);
}

TEST_F(HybridGdnEngineTest, StaticBatchesGiveTheFullForwardLogitsAndTokens) {
  EngineOptions o = options(8);
  o.max_requests = 3;
  StatusOr<EngineResult> r = run_inference_engine(*model_, prompts_, o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  testing::expect_full_forward_tokens(prompts_, *r, o, check_);
  // 3 slots of 2 Mamba layers (conv 3·(96 + 2·2·8), ssm 6·16·8) and 2 GDN layers (conv 3·(2·2·8 + 4·6),
  // the delta rule's 4·8·6).
  EXPECT_EQ(r->mamba_state_bytes, 3 * (2 * (3 * (96 + 2 * 2 * 8) + 6 * 16 * 8) + 2 * (3 * (2 * 2 * 8 + 4 * 6) + 4 * 8 * 6)) * 4);
}

TEST_F(HybridGdnEngineTest, DynamicBatchingMovesTheStateSlotsWithTheRequests) {
  EngineResult r;
  testing::expect_dynamic_batching_gives_full_forward_tokens(*model_, prompts_, options(10), check_, &r);
  EXPECT_EQ(r.mamba_slots, static_cast<int64_t>(prompts_.size()));
}

TEST_F(HybridGdnEngineTest, EvaluateScoringGivesTheTrainingForwardsLoss) {
  testing::expect_ppl_scoring_equals_training_loss(&model_, 31);
}

}  // namespace
}  // namespace gale
