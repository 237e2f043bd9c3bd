// Batched generation of a hybrid Mamba model (train/inference_engine.h with model/mamba_state.h):
// static batches and dynamic batching (requests pausing for blocks and joining mid-flight, each
// holding a Mamba state slot) give every request, at every step, the logits (within 1e-4 relative)
// and greedy tokens of rerunning its whole sequence; the slots and blocks all come back. Beam search
// over per-beam caches that beams take over or clone (as `gale generate --num-beams` keeps them)
// finds the hypothesis of a search over whole-sequence forwards.
#include "train/inference_engine.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <map>

#include "core/allocator.h"
#include "kernels/cpu/fused_ops.h"
#include "model/hybrid_test_model.h"
#include "train/beam_search.h"

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
    std::printf("largest relative logits difference %.2e\n", worst_);
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

// Beam search with one KvCache per beam, as train/generate.cc's beam_generate: a beam continuing
// another takes over its cache when it is the last to, else a clone_kv_cache (Mamba states and all);
// against the same search whose every row is a whole-sequence forward of the beam's tokens.
TEST_F(HybridEngineTest, BeamSearchOverCachedBeamsFindsTheFullForwardHypothesis) {
  const int64_t V = c_.vocab;
  BeamSearchOptions o;
  o.num_beams = 3;
  o.max_new_tokens = 8;
  for (const std::vector<int32_t>& prompt : {prompts_[0], prompts_[3], prompts_[7]}) {
    std::vector<KvCache> caches;
    caches.push_back(make_kv_cache(c_, model_->partition(), 1, c_.max_positions));
    auto cached_row = [&](KvCache& cache, const std::vector<int32_t>& ids) {
      MicroBatch mb;
      mb.B = 1;
      mb.S = static_cast<int64_t>(ids.size());
      mb.tokens = ids;
      mb.position_ids.assign(ids.size(), 0);
      const Tensor l = model_->forward_logits(mb, Tensor(), &cache);
      return log_softmax_row(l.data<float>() + (mb.S - 1) * V, V, 1.0);
    };
    BeamModel cached;
    cached.start = [&] { return cached_row(caches[0], prompt); };
    cached.advance = [&](const std::vector<int>& parents, const std::vector<int32_t>& tokens) {
      std::vector<KvCache> next(parents.size());
      for (size_t i = 0; i < parents.size(); ++i) {
        const bool last_use =
            std::find(parents.begin() + static_cast<std::ptrdiff_t>(i) + 1, parents.end(), parents[i]) == parents.end();
        next[i] = last_use ? std::move(caches[parents[i]]) : clone_kv_cache(caches[parents[i]]);
      }
      caches = std::move(next);
      std::vector<std::vector<double>> rows;
      for (size_t i = 0; i < caches.size(); ++i) rows.push_back(cached_row(caches[i], {tokens[i]}));
      return rows;
    };
    std::vector<std::vector<int32_t>> seqs = {prompt};
    BeamModel full;
    auto full_row = [&](const std::vector<int32_t>& ids) {
      const std::vector<float> l = testing::full_forward_last_logits(*model_, ids);
      return log_softmax_row(l.data(), V, 1.0);
    };
    full.start = [&] { return full_row(prompt); };
    full.advance = [&](const std::vector<int>& parents, const std::vector<int32_t>& tokens) {
      std::vector<std::vector<int32_t>> next;
      std::vector<std::vector<double>> rows;
      for (size_t i = 0; i < parents.size(); ++i) {
        next.push_back(seqs[static_cast<size_t>(parents[i])]);
        next.back().push_back(tokens[i]);
        rows.push_back(full_row(next.back()));
      }
      seqs = std::move(next);
      return rows;
    };
    const BeamSearchResult a = beam_search(o, cached), b = beam_search(o, full);
    EXPECT_EQ(a.tokens, b.tokens) << "prompt of " << prompt.size();
    EXPECT_NEAR(a.score, b.score, 1e-4 * std::abs(b.score)) << "prompt of " << prompt.size();
  }
}

}  // namespace
}  // namespace gale
