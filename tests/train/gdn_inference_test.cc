// Inference of a Gated DeltaNet model (G * G G *: GDN and full-attention layers): batched generation
// (train/inference_engine.h; each request's GDN states in a slot of model/mamba_state.h) — static
// batches and dynamic batching with requests pausing and joining mid-flight — gives every request, at
// every step, the logits (within 1e-4 relative) and greedy tokens of rerunning its whole sequence,
// and every slot and block comes back; `gale evaluate`'s scoring (sequence_negative_log_likelihood)
// gives the training forward's loss.
#include "train/inference_engine.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <map>

#include "core/allocator.h"
#include "kernels/cpu/fused_ops.h"
#include "model/gdn_test_model.h"
#include "tokenizer/null_tokenizer.h"
#include "train/evaluate.h"

namespace gale {
namespace {

class GdnEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    c_ = testing::tiny_gdn_config();
    ops_ = reference_ops();
    GALE_CHECK_OK(install_all_fused_kernels(ops_, detected_isa()));
    model_ = std::make_unique<GPTModel>(c_, single_process_partition(c_), &ops_);
    model_->params().initialize(7);
    testing::make_gdn_state_carry(*model_);
    for (int64_t len : {5, 1, 17, 40, 3, 12, 2, 9}) {  // 40: it reaches the last position
      std::vector<int32_t> p;
      for (int64_t i = 0; i < len; ++i) p.push_back(static_cast<int32_t>((len * 31 + i * 7 + 3) % c_.vocab));
      prompts_.push_back(p);
    }
  }
  // Greedy options whose sampler checks each request's logits against the full forward of its
  // prompt and the tokens it has so far (worst_ the largest relative difference).
  EngineOptions options(int64_t max_new) {
    EngineOptions o;
    o.max_new_tokens = max_new;
    o.max_length = c_.max_positions;
    o.kv_length = c_.max_positions;
    so_far_.clear();
    worst_ = 0.0;
    o.sample = [this](const float* l, int64_t request, int64_t step) {
      std::vector<int32_t>& got = so_far_[request];
      EXPECT_EQ(static_cast<int64_t>(got.size()), step);
      std::vector<int32_t> seq = prompts_[static_cast<size_t>(request)];
      seq.insert(seq.end(), got.begin(), got.end());
      const std::vector<float> want = testing::full_forward_last_logits(*model_, seq);
      worst_ = std::max(worst_, testing::logits_rel_diff(l, want));
      const int32_t t = testing::argmax_row(l, c_.vocab);
      EXPECT_EQ(t, testing::argmax_row(want.data(), c_.vocab)) << "request " << request << ", step " << step;
      got.push_back(t);
      return t;
    };
    return o;
  }
  void expect_full_forward_logits(const EngineResult& r) {
    ASSERT_EQ(r.generated.size(), prompts_.size());
    for (size_t i = 0; i < prompts_.size(); ++i) EXPECT_EQ(r.generated[i], so_far_[static_cast<int64_t>(i)]) << i;
    EXPECT_LT(worst_, 1e-4);
    std::printf("largest relative logits difference %.2e\n", worst_);
  }
  ModelConfig c_;
  OpTable ops_;
  std::unique_ptr<GPTModel> model_;
  std::vector<std::vector<int32_t>> prompts_;
  std::map<int64_t, std::vector<int32_t>> so_far_;
  double worst_ = 0.0;
};

TEST_F(GdnEngineTest, StaticBatchesGiveTheFullForwardLogitsAndTokens) {
  EngineOptions o = options(8);
  o.max_requests = 3;
  StatusOr<EngineResult> r = run_inference_engine(*model_, prompts_, o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  expect_full_forward_logits(*r);
  // 3 slots of 3 GDN layers: conv 3·(2·2·8 + 4·6) and the delta rule's 4·8·6 floats each.
  EXPECT_EQ(r->mamba_state_bytes, 3 * 3 * (3 * (2 * 2 * 8 + 4 * 6) + 4 * 8 * 6) * 4);
}

TEST_F(GdnEngineTest, DynamicBatchingMovesTheStateSlotsWithTheRequests) {
  EngineOptions o = options(10);
  o.dynamic = true;
  const KvBlockPool probe(c_, single_process_partition(c_), 4, 1);
  // The two attention layers' keys and values only.
  EXPECT_EQ(probe.block_bytes(), 2 * 4 * 2 * c_.kv_heads * c_.head_dim * static_cast<int64_t>(sizeof(float)));
  // As tests/train/hybrid_inference_engine_test.cc: 808 blocks of 4 (64 guaranteed requests) and
  // 64-token steps, fewer than the prompts' 89 tokens: requests join mid-flight.
  DynamicBufferFlags f;
  f.buffer_size_gb = static_cast<double>(808 * probe.block_bytes()) / (1024.0 * 1024.0 * 1024.0) + 1e-12;
  f.max_tokens_override = 64;
  StatusOr<DynamicBudget> b = dynamic_budget(f, 4, probe.block_bytes(), 48);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  o.budget = *b;
  const int64_t before = host_allocator().current_bytes();
  {
    StatusOr<EngineResult> r = run_inference_engine(*model_, prompts_, o);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    expect_full_forward_logits(*r);
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
  std::vector<int32_t> ids;
  for (int i = 0; i < 31; ++i) ids.push_back(static_cast<int32_t>((i * 17 + 5) % c_.vocab));
  MicroBatch mb;
  mb.B = 1;
  mb.S = static_cast<int64_t>(ids.size()) - 1;
  mb.tokens.assign(ids.begin(), ids.end() - 1);
  mb.labels.assign(ids.begin() + 1, ids.end());
  mb.loss_mask.assign(static_cast<size_t>(mb.S), 1.0f);
  for (int64_t s = 0; s < mb.S; ++s) mb.position_ids.push_back(static_cast<int32_t>(s));
  GPTModel::LossSums train;
  model_->forward(0, mb, Tensor(), /*training=*/true, &train);
  InferenceModel m;
  m.config = c_;
  StatusOr<std::unique_ptr<NullTokenizer>> tok = NullTokenizer::create(c_.vocab - 1);  // its vocabulary: V
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  m.tokenizer = std::move(tok).value();
  GPTModel* borrowed = model_.release();  // the InferenceModel owns the model for the call
  m.model.reset(borrowed);
  int64_t tokens = 0;
  const double nll = sequence_negative_log_likelihood(m, ids, mb.S, &tokens);
  model_.reset(m.model.release());
  EXPECT_EQ(tokens, mb.S);
  EXPECT_EQ(train.tokens, static_cast<double>(mb.S));
  EXPECT_NEAR(nll, train.loss_sum, 1e-5 * train.loss_sum);
  std::printf("evaluate %.8f, training forward %.8f\n", nll, train.loss_sum);
}

}  // namespace
}  // namespace gale
