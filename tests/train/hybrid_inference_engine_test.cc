// Batched generation of a hybrid Mamba model (train/inference_engine.h with model/mamba_state.h):
// static batches and dynamic batching (requests pausing for blocks and joining mid-flight, each
// holding a Mamba state slot) give every request, at every step, the logits (within 1e-4 relative)
// and greedy tokens of rerunning its whole sequence; the slots and blocks all come back.
#include "train/inference_engine.h"

#include <gtest/gtest.h>

#include <map>

#include "core/allocator.h"
#include "kernels/cpu/fused_ops.h"
#include "model/hybrid_test_model.h"

namespace gale {
namespace {

class HybridEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    c_ = testing::tiny_hybrid_config();
    ops_ = reference_ops();
    GALE_CHECK_OK(install_all_fused_kernels(ops_, detected_isa()));
    model_ = std::make_unique<GPTModel>(c_, single_process_partition(c_), &ops_);
    model_->params().initialize(7);
    testing::make_mamba_state_carry(*model_);
    for (int64_t len : {5, 1, 17, 9, 40, 3, 12, 2, 44, 7, 25}) {  // 40 and 44: they reach the last position
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
  void expect_full_forward_tokens(const EngineResult& r, const EngineOptions& o) {
    ASSERT_EQ(r.generated.size(), prompts_.size());
    for (size_t i = 0; i < prompts_.size(); ++i) {
      std::vector<int32_t> seq = prompts_[i], want;
      while (static_cast<int64_t>(want.size()) < o.max_new_tokens && static_cast<int64_t>(seq.size()) < o.max_length) {
        const std::vector<float> l = testing::full_forward_last_logits(*model_, seq);
        want.push_back(testing::argmax_row(l.data(), c_.vocab));
        seq.push_back(want.back());
      }
      EXPECT_EQ(r.generated[i], want) << "prompt " << i;
    }
    EXPECT_LT(worst_, 1e-4);
  }
  ModelConfig c_;
  OpTable ops_;
  std::unique_ptr<GPTModel> model_;
  std::vector<std::vector<int32_t>> prompts_;
  std::map<int64_t, std::vector<int32_t>> so_far_;
  double worst_ = 0.0;
};

TEST_F(HybridEngineTest, StaticBatchesGiveTheFullForwardLogitsAndTokens) {
  for (int64_t batch : {4, 16}) {
    EngineOptions o = options(10);
    o.max_requests = batch;
    StatusOr<EngineResult> r = run_inference_engine(*model_, prompts_, o);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    expect_full_forward_tokens(*r, o);
    EXPECT_GT(r->mamba_state_bytes, 0);
  }
}

TEST_F(HybridEngineTest, DynamicBatchingMovesTheMambaSlotsWithTheRequests) {
  EngineOptions o = options(12);
  o.dynamic = true;
  const KvBlockPool probe(c_, single_process_partition(c_), 4, 1);
  // The two attention layers' keys and values only.
  EXPECT_EQ(probe.block_bytes(), 2 * 4 * 2 * c_.kv_heads * c_.head_dim * static_cast<int64_t>(sizeof(float)));
  // As tests/train/inference_engine_test.cc: 808 blocks of 4, 64 guaranteed requests, 64-token steps,
  // so requests pause for blocks and join mid-flight.
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
    expect_full_forward_tokens(*r, o);
    EXPECT_GT(r->joined_mid_flight, 0);
    EXPECT_GT(r->pauses, 0);
    EXPECT_EQ(r->free_blocks_at_end, r->num_blocks);
    EXPECT_EQ(r->mamba_slots, static_cast<int64_t>(prompts_.size()));
    EXPECT_EQ(r->free_mamba_slots_at_end, r->mamba_slots);
  }
  EXPECT_EQ(host_allocator().current_bytes(), before) << "the KV buffer, the Mamba slots and every step's tensors are freed";
}

}  // namespace
}  // namespace gale
