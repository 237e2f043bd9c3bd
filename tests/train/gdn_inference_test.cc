// Inference of a Gated DeltaNet model (G * G G *: GDN and full-attention layers): batched generation
// (train/inference_engine.h; each request's GDN states in a slot of model/mamba_state.h) — static
// batches and dynamic batching with requests pausing and joining mid-flight — gives every request, at
// every step, the logits (within 1e-4 relative) and greedy tokens of rerunning its whole sequence,
// and every slot and block comes back; `gale evaluate`'s scoring (sequence_negative_log_likelihood)
// gives the training forward's loss.
#include "train/inference_engine.h"

#include <gtest/gtest.h>

#include <cstdio>

#include "core/allocator.h"
#include "model/gdn_test_model.h"
#include "train/engine_decoding_check.h"
#include "train/evaluate_check.h"

namespace gale {
namespace {

class GdnEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    c_ = testing::tiny_gdn_config();
    ops_ = testing::decoding_ops();
    model_ = testing::decoding_model(c_, &ops_, 7);
    testing::make_gdn_state_carry(*model_);
    prompts_ = testing::engine_prompts({5, 1, 17, 40, 3, 12, 2, 9}, c_.vocab);  // 40: it reaches the last position
  }
  EngineOptions options(int64_t max_new) {
    return testing::full_forward_checked_options(*model_, prompts_, max_new, &check_);
  }
  ModelConfig c_;
  OpTable ops_;
  std::unique_ptr<GPTModel> model_;
  std::vector<std::vector<int32_t>> prompts_;
  testing::FullForwardCheck check_;
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

TEST_F(GdnEngineTest, DynamicBatchingMovesTheStateSlotsWithTheRequests) {
  EngineOptions o = options(10);
  o.dynamic = true;
  const KvBlockPool probe(c_, single_process_partition(c_), 4, 1);
  // The two attention layers' keys and values only.
  EXPECT_EQ(probe.block_bytes(), 2 * 4 * 2 * c_.kv_heads * c_.head_dim * static_cast<int64_t>(sizeof(float)));
  // 64-token steps, fewer than the prompts' 89 tokens: requests join mid-flight.
  StatusOr<DynamicBudget> b = testing::small_dynamic_budget(probe.block_bytes());
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  o.budget = *b;
  const int64_t before = host_allocator().current_bytes();
  {
    StatusOr<EngineResult> r = run_inference_engine(*model_, prompts_, o);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    testing::expect_full_forward_tokens(prompts_, *r, o, check_);
    EXPECT_GT(r->joined_mid_flight, 0);
    EXPECT_EQ(r->free_blocks_at_end, r->num_blocks);
    EXPECT_EQ(r->free_mamba_slots_at_end, r->mamba_slots);
    std::printf("%lld pauses, %lld joined mid-flight\n", static_cast<long long>(r->pauses),
                static_cast<long long>(r->joined_mid_flight));
  }
  EXPECT_EQ(host_allocator().current_bytes(), before) << "the KV buffer, the state slots and every step's tensors are freed";
}

// The perplexity `gale evaluate --task ppl` reports is Σ −log p of each next token by a whole-sequence
// forward; the training forward's loss on the same tokens and labels is the same sum.
TEST_F(GdnEngineTest, EvaluateScoringGivesTheTrainingForwardsLoss) {
  testing::expect_ppl_scoring_equals_training_loss(&model_, 31);
}

}  // namespace
}  // namespace gale
