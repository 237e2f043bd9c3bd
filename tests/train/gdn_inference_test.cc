// Inference of a Gated DeltaNet model (G * G G *: GDN and full-attention layers): batched generation
// (train/inference_engine.h; each request's GDN states in a slot of model/mamba_state.h) — static
// batches and dynamic batching with requests pausing and joining mid-flight — gives every request, at
// every step, the logits (within 1e-4 relative) and greedy tokens of rerunning its whole sequence,
// and every slot and block comes back; `gale evaluate`'s scoring (sequence_negative_log_likelihood)
// gives the training forward's loss.
#include "train/inference_engine.h"

#include <gtest/gtest.h>

#include <cstdio>

#include "model/gdn_test_model.h"
#include "train/engine_decoding_check.h"
#include "train/evaluate_check.h"

namespace gale {
namespace {

class GdnEngineTest : public testing::EngineDecodingTest {
 protected:
  void SetUp() override {  // 40: it reaches the last position
    set_up(testing::tiny_gdn_config(), testing::make_gdn_state_carry, {5, 1, 17, 40, 3, 12, 2, 9});
  }
};

TEST_F(GdnEngineTest, StaticBatchesGiveTheFullForwardLogitsAndTokens) {
  EngineOptions o = options(8);
  o.max_requests = 3;
  StatusOr<EngineResult> r = run_inference_engine(*model_, prompts_, o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  testing::expect_full_forward_tokens(prompts_, *r, o, check_);
  // 3 slots of 3 GDN layers: conv 3·(2·2·8 + 4·6) and the delta rule's 4·8·6 floats each.
  EXPECT_EQ(r->mamba_state_bytes, 3 * 3 * (3 * (2 * 2 * 8 + 4 * 6) + 4 * 8 * 6) * 4);
}

// 64-token steps, fewer than the prompts' 89 tokens: requests join mid-flight.
TEST_F(GdnEngineTest, DynamicBatchingMovesTheStateSlotsWithTheRequests) {
  // The blocks hold the two attention layers' keys and values only.
  EXPECT_EQ(KvBlockPool(c_, single_process_partition(c_), 4, 1).block_bytes(),
            2 * 4 * 2 * c_.kv_heads * c_.head_dim * static_cast<int64_t>(sizeof(float)));
  EngineResult r;
  testing::expect_dynamic_batching_gives_full_forward_tokens(*model_, prompts_, options(10), check_, &r);
  std::printf("%lld pauses, %lld joined mid-flight\n", static_cast<long long>(r.pauses),
              static_cast<long long>(r.joined_mid_flight));
}

// The perplexity `gale evaluate --task ppl` reports is Σ −log p of each next token by a whole-sequence
// forward; the training forward's loss on the same tokens and labels is the same sum.
TEST_F(GdnEngineTest, EvaluateScoringGivesTheTrainingForwardsLoss) {
  testing::expect_ppl_scoring_equals_training_loss(&model_, 31);
}

}  // namespace
}  // namespace gale
