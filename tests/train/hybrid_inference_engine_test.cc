// Batched generation of a hybrid Mamba model (train/inference_engine.h with model/mamba_state.h):
// static batches and dynamic batching (requests pausing for blocks and joining mid-flight, each
// holding a Mamba state slot) give every request, at every step, the logits (within 1e-4 relative)
// and greedy tokens of rerunning its whole sequence; the slots and blocks all come back. Beam search
// over per-beam caches that beams take over or clone (as `gale generate --num-beams` keeps them)
// finds the hypothesis of a search over whole-sequence forwards.
#include "train/inference_engine.h"

#include <gtest/gtest.h>

#include "model/hybrid_test_model.h"
#include "train/beam_search.h"
#include "train/engine_decoding_check.h"

namespace gale {
namespace {

class HybridEngineTest : public testing::EngineDecodingTest {
 protected:
  void SetUp() override {  // 40 and 44: they reach the last position
    set_up(testing::tiny_hybrid_config(), testing::make_mamba_state_carry, {5, 1, 17, 9, 40, 3, 12, 2, 44, 7, 25});
  }
};

TEST_F(HybridEngineTest, StaticBatchesGiveTheFullForwardLogitsAndTokens) {
  for (int64_t batch : {4, 16}) {
    EngineOptions o = options(10);
    o.max_requests = batch;
    StatusOr<EngineResult> r = run_inference_engine(*model_, prompts_, o);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    testing::expect_full_forward_tokens(prompts_, *r, o, check_);
    EXPECT_GT(r->mamba_state_bytes, 0);
  }
}

// Requests pause for blocks and join mid-flight; each holds a Mamba state slot.
TEST_F(HybridEngineTest, DynamicBatchingMovesTheMambaSlotsWithTheRequests) {
  // The blocks hold the two attention layers' keys and values only.
  EXPECT_EQ(KvBlockPool(c_, single_process_partition(c_), 4, 1).block_bytes(),
            2 * 4 * 2 * c_.kv_heads * c_.head_dim * static_cast<int64_t>(sizeof(float)));
  EngineResult r;
  testing::expect_dynamic_batching_gives_full_forward_tokens(*model_, prompts_, options(12), check_, &r);
  EXPECT_GT(r.pauses, 0);
  EXPECT_EQ(r.mamba_slots, static_cast<int64_t>(prompts_.size()));
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
      return log_softmax_row(testing::cached_last_logits(*model_, cache, {ids})[0].data(), V, 1.0);
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
