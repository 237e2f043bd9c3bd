// Batched generation (train/inference_engine.h): static and dynamic batching give every prompt the
// greedy tokens of generating it alone (prompts of mixed lengths, requests that finish early on a
// stop token or at the last position, and, under dynamic batching, requests that pause for a block
// and join mid-flight), with --flash-decode too; the KV blocks all come back and the allocator's
// bytes return to the baseline; Megatron's buffer sizing (max requests and tokens, the guaranteed
// reserve, overrides) and its errors.
#include "train/inference_engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "core/allocator.h"
#include "model/tiny_model_training.h"
#include "train/engine_decoding_check.h"

namespace gale {
namespace {

// One prompt alone, as `gale generate --prompt` decodes it: the prompt in one pass, then one token
// per step with a KvCache.
std::vector<int32_t> alone(GPTModel& m, const std::vector<int32_t>& prompt, int64_t max_new, int64_t max_length,
                           const std::vector<int32_t>& stops) {
  KvCache cache = make_kv_cache(m.config(), m.partition(), 1, max_length);
  auto next = [&](const std::vector<int32_t>& ids) {
    return testing::argmax_row(testing::cached_last_logits(m, cache, {ids})[0].data(), m.config().vocab);
  };
  std::vector<int32_t> out;
  int32_t t = next(prompt);
  int64_t length = static_cast<int64_t>(prompt.size());
  for (int64_t step = 0; step < max_new && length < max_length; ++step) {
    if (std::find(stops.begin(), stops.end(), t) != stops.end()) break;
    out.push_back(t);
    if (++length >= max_length || step + 1 == max_new) break;
    t = next({t});
  }
  return out;
}

class InferenceEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    c_ = testing::tiny_llama_config();  // RoPE, GQA (8 heads over 2 KV heads)
    c_.max_positions = 48;
    ops_ = reference_ops();
    GALE_CHECK_OK(install_fused_kernel(ops_, "attention", detected_isa()));
    model_ = testing::decoding_model(c_, &ops_, 7);
    // 40 and 44: they reach the last position.
    prompts_ = testing::engine_prompts({5, 1, 17, 9, 40, 3, 12, 2, 44, 7, 25}, c_.vocab);
  }
  EngineOptions options(int64_t max_new) const {
    EngineOptions o;
    o.max_new_tokens = max_new;
    o.max_length = c_.max_positions;
    o.kv_length = c_.max_positions;
    const int64_t vocab = c_.vocab;
    o.sample = [vocab](const float* l, int64_t, int64_t) { return testing::argmax_row(l, vocab); };
    return o;
  }
  void expect_alone_tokens(const EngineResult& r, const EngineOptions& o) {
    ASSERT_EQ(r.generated.size(), prompts_.size());
    for (size_t i = 0; i < prompts_.size(); ++i)
      EXPECT_EQ(r.generated[i], alone(*model_, prompts_[i], o.max_new_tokens, o.max_length, o.stop_tokens))
          << "prompt " << i;
  }
  ModelConfig c_;
  OpTable ops_;
  std::unique_ptr<GPTModel> model_;
  std::vector<std::vector<int32_t>> prompts_;
};

TEST_F(InferenceEngineTest, StaticBatchesGiveTheTokensOfEachPromptAlone) {
  EngineOptions o = options(10);
  // A stop token the third prompt meets early: requests of a batch finish at different steps.
  const std::vector<int32_t> free_run = alone(*model_, prompts_[2], 10, o.max_length, {});
  ASSERT_GE(free_run.size(), 4u);
  o.stop_tokens = {free_run[3]};
  for (int64_t batch : {1, 4, 16}) {
    o.max_requests = batch;
    StatusOr<EngineResult> r = run_inference_engine(*model_, prompts_, o);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    expect_alone_tokens(*r, o);
    EXPECT_EQ(r->peak_requests, std::min<int64_t>(batch, static_cast<int64_t>(prompts_.size())));
  }
  EXPECT_LT(alone(*model_, prompts_[2], 10, o.max_length, o.stop_tokens).size(), 4u);
}

TEST_F(InferenceEngineTest, DynamicBatchingPausesJoinsAndGivesEveryBlockBack) {
  EngineOptions o = options(12);
  o.dynamic = true;
  const KvBlockPool probe(c_, single_process_partition(c_), 4, 1);
  // 64 guaranteed requests of 12 blocks (max seq 48, blocks of 4) take 768 blocks of the 808; and a
  // step holds at most 64 tokens, so the 40-token prompt waits for the first four to be prefilled
  // and the others join mid-flight.
  StatusOr<DynamicBudget> b = testing::small_dynamic_budget(probe.block_bytes());
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(b->num_blocks, 808);
  EXPECT_EQ(b->gtd_request_count, 64);
  EXPECT_EQ(b->gtd_block_count, 768);
  EXPECT_EQ(b->max_tokens, 64);
  EXPECT_EQ(b->max_requests, 64);  // min(int(808·4 / 48) = 67, max_tokens)
  o.budget = *b;
  for (int64_t flash : {0, 3}) {
    o.flash_decode_chunk = flash;
    const int64_t before = host_allocator().current_bytes();
    {
      StatusOr<EngineResult> r = run_inference_engine(*model_, prompts_, o);
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      expect_alone_tokens(*r, o);
      EXPECT_GT(r->joined_mid_flight, 0);
      EXPECT_GT(r->pauses, 0);
      EXPECT_EQ(r->free_blocks_at_end, r->num_blocks);
      EXPECT_LE(r->peak_kv_bytes, r->kv_bytes_allocated);
      EXPECT_GT(r->peak_kv_bytes, 0);
    }
    EXPECT_EQ(host_allocator().current_bytes(), before) << "the KV buffer and every step's tensors are freed";
  }
}

// The ragged forward's logits are each request's KvCache logits: three requests in blocks of 5
// positions (several per request, not in order), prefilled together, then decoding one token each
// while a fourth joins with its prompt; a sliding window of 6 too. Tolerance 2e-5 as the KV-cache
// test: the same kernels, the GEMMs over a different number of rows.
TEST_F(InferenceEngineTest, RaggedLogitsEqualEachRequestsKvCacheLogits) {
  for (int64_t window : {0, 6}) {
    c_.sliding_window = window;
    GPTModel model(c_, single_process_partition(c_), &ops_);
    model.params().initialize(7);
    KvBlockPool pool(c_, single_process_partition(c_), 5, 40);
    const std::vector<std::vector<int32_t>> seqs = {prompts_[0], prompts_[2], prompts_[3], prompts_[6]};  // 5, 17, 9, 12
    std::vector<KvCache> caches;
    std::vector<RaggedRequest> reqs(seqs.size());
    for (size_t i = 0; i < seqs.size(); ++i) {
      caches.push_back(make_kv_cache(c_, single_process_partition(c_), 1, c_.max_positions));
      std::vector<int32_t> b = pool.allocate(5);
      std::reverse(b.begin(), b.end());
      reqs[i].blocks = b;
    }
    // Step 1: requests 0..2 prefill; step 2: they decode one token each and request 3 prefills.
    for (int step = 0; step < 2; ++step) {
      RaggedKvBatch batch;
      batch.pool = &pool;
      std::vector<int32_t> tokens;
      std::vector<size_t> which;
      for (size_t i = 0; i < seqs.size(); ++i) {
        if (step == 0 && i == 3) continue;
        RaggedRequest r = reqs[i];
        std::vector<int32_t> ids = (reqs[i].cached == 0) ? seqs[i] : std::vector<int32_t>{int32_t(7 + i)};
        r.rows = static_cast<int64_t>(ids.size());
        tokens.insert(tokens.end(), ids.begin(), ids.end());
        batch.requests.push_back(r);
        which.push_back(i);
      }
      const Tensor got = model.forward_logits_ragged(tokens, batch);
      for (size_t k = 0; k < which.size(); ++k) {
        const size_t i = which[k];
        const std::vector<int32_t> ids = (reqs[i].cached == 0) ? seqs[i] : std::vector<int32_t>{int32_t(7 + i)};
        const std::vector<float> want = testing::cached_last_logits(model, caches[i], {ids})[0];
        double worst = 0.0;
        for (int64_t v = 0; v < c_.vocab; ++v)
          worst = std::max(worst, std::abs(double(got.data<float>()[k * c_.vocab + v]) - double(want[v])));
        EXPECT_LT(worst, 2e-5) << "window " << window << ", step " << step << ", request " << i;
        reqs[i].cached += static_cast<int64_t>(ids.size());
      }
    }
  }
}

TEST(DynamicBudget, SizesAsMegatronDoes) {
  DynamicBufferFlags f;
  f.buffer_size_gb = 1.0;  // 2^30 bytes of 1 MiB blocks of 256 positions: 1024 blocks, 262144 tokens
  StatusOr<DynamicBudget> b = dynamic_budget(f, 256, 1 << 20, 2560);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(b->num_blocks, 1024);
  EXPECT_EQ(b->max_tokens, 262144);
  EXPECT_EQ(b->max_requests, 102);  // int(262144 / 2560)
  EXPECT_EQ(b->max_blocks_per_request, 10);
  EXPECT_EQ(b->gtd_request_count, 64);  // round64(min(max(1, int(0.2·262144 / 2560) = 20), 102))
  EXPECT_EQ(b->gtd_block_count, 640);
  f.overflow_factor = 2.0;
  b = dynamic_budget(f, 256, 1 << 20, 2560);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->max_requests, 256);     // round64(204)
  EXPECT_EQ(b->max_tokens, 10496);     // round64(int(262144·2 / 50) = 10485)
  f.max_requests_override = 100;
  f.max_tokens_override = 70;
  b = dynamic_budget(f, 256, 1 << 20, 2560);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->max_tokens, 128);
  EXPECT_EQ(b->max_requests, 128);  // min(round64(100), max_tokens)
}

TEST(DynamicBudget, ErrorsNameTheFlag) {
  DynamicBufferFlags f;
  f.buffer_size_gb = 1e-9;
  StatusOr<DynamicBudget> b = dynamic_budget(f, 256, 1 << 20, 2560);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("--inference-dynamic-batching-buffer-size-gb 1e-09: 1 bytes, less than one KV "
                                      "block of 256 positions (1048576 bytes)"),
            std::string::npos)
      << b.status().message();
  f.buffer_size_gb = 0.1;  // 102 blocks: 10 requests of 2560, fewer than the 64 guaranteed
  b = dynamic_budget(f, 256, 1 << 20, 2560);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("gtd_request_count (64) > max_requests (10)"), std::string::npos)
      << b.status().message();
  f.max_requests_override = 64;  // now 64 requests, but their reserve (640 blocks) is more than the buffer
  b = dynamic_budget(f, 256, 1 << 20, 2560);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("leaves none of the 102 blocks"), std::string::npos) << b.status().message();
}

}  // namespace
}  // namespace gale
