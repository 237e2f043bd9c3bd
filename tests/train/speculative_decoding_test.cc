// Speculative decoding with MTP drafts (train/inference_engine.h, --num-speculative-tokens): the
// engine's tokens with N = 1, 2 drafts a step are those of N = 0 (greedy, and sampling with a fixed
// seed), under static and dynamic batching of prompts of mixed lengths; the accepted drafts are the
// count of a replay that runs the MTP layers by hand on the final tokens; the KV rollback drops the
// rejected drafts' keys and values and gives their blocks back; the drafting MTP layers compute the
// training forward's MTP losses; the refusals name the flag.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "core/allocator.h"
#include "core/rng.h"
#include "model/gdn_test_model.h"
#include "model/hybrid_test_model.h"
#include "model/tiny_model_training.h"
#include "train/engine_decoding_check.h"
#include "train/inference_engine.h"

namespace gale {
namespace {

constexpr int64_t kMaxLength = 48;

// The decoder's final-norm output of every position of `ids` [S, H], by one forward of the whole
// sequence (one request, nothing cached).
Tensor whole_sequence_hidden(GPTModel& m, const std::vector<int32_t>& ids) {
  const int64_t S = static_cast<int64_t>(ids.size());
  KvBlockPool pool(m.config(), m.partition(), S, 1);
  MambaStatePool states(m.config(), m.partition(), 1);  // a model's recurrent layers start from zero
  RaggedKvBatch rb;
  rb.pool = &pool;
  RaggedRequest rr;
  rr.blocks = pool.allocate(1);
  rr.rows = S;
  if (states.has_layers()) {
    rb.mamba = &states;
    rr.mamba_slot = states.allocate();
  }
  rb.requests.push_back(rr);
  Tensor hidden;
  m.forward_ragged_rows(ids, rb, {}, &hidden, nullptr);
  pool.release(rr.blocks);
  return hidden;
}

struct Replay {
  int64_t drafted = 0, accepted = 0;
};

// The drafts and accepted drafts of greedy speculative decoding of `prompt` whose tokens are `out`
// (ended by --max-new-tokens or the last position, no stop token), replayed from the final
// sequence: after e emitted tokens the last one is at position c = |prompt| + e − 1; MTP layer k
// (run here by hand, one request at a time) drafts from the whole-sequence hidden state at c − 1
// (then its own output) and the token at c + k; the j-th draft counts while it equals out[e + j]
// and that token does not end the request.
Replay replay(GPTModel& m, const std::vector<int32_t>& prompt, const std::vector<int32_t>& out, int64_t n_spec,
              int64_t max_new) {
  std::vector<int32_t> full = prompt;
  full.insert(full.end(), out.begin(), out.end());
  const Tensor hidden = whole_sequence_hidden(m, full);
  const int64_t H = m.config().hidden, V = m.config().vocab, P = static_cast<int64_t>(prompt.size());
  const int64_t n_out = static_cast<int64_t>(out.size());
  Replay r;
  for (int64_t e = 1; e < n_out;) {
    const int64_t c = P + e - 1;
    const int64_t cap = std::max<int64_t>(0, std::min({n_spec, max_new - e - 1, kMaxLength - 2 - c}));
    Tensor h = Tensor::empty({1, H});
    std::copy_n(hidden.data<float>() + (c - 1) * H, H, h.data<float>());
    std::vector<int32_t> token = {full[static_cast<size_t>(c)]}, pos = {static_cast<int32_t>(c)};
    std::vector<int32_t> drafts;
    for (int64_t k = 0; k < cap; ++k) {
      Tensor h_next, logits;
      m.mtp_single_position(k, h, token, pos, &h_next, &logits);
      drafts.push_back(testing::argmax_row(logits.data<float>(), V));
      token = {drafts.back()};
      pos = {pos[0] + 1};
      h = h_next;
    }
    int64_t a = 0;
    while (a < cap && e + a < n_out - 1 && drafts[static_cast<size_t>(a)] == out[static_cast<size_t>(e + a)]) ++a;
    r.drafted += cap;
    r.accepted += a;
    e += 1 + a;
  }
  return r;
}

class SpeculativeDecodingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    c_ = testing::tiny_llama_config();  // RoPE, GQA
    c_.vocab = 8;                        // few tokens: random drafts are accepted now and then
    c_.max_positions = kMaxLength;
    c_.mtp_num_layers = 2;
    ops_ = testing::decoding_ops();
    model_ = testing::decoding_model(c_, &ops_, 11);
    // GPT-shaped: learned absolute positions, so the drafts' position ids matter.
    ModelConfig g = testing::tiny_gpt_config();
    g.vocab = 8;
    g.max_positions = kMaxLength;
    g.mtp_num_layers = 2;
    gpt_ = testing::decoding_model(g, &ops_, 5);
    prompts_ = testing::engine_prompts({5, 1, 17, 9, 40, 3, 12, 44, 7}, c_.vocab);  // 40 and 44 reach the end
  }
  EngineOptions greedy(int64_t max_new, int64_t n_spec) const {
    EngineOptions o;
    o.max_new_tokens = max_new;
    o.max_length = kMaxLength;
    o.kv_length = kMaxLength;
    o.max_requests = 4;
    o.num_speculative_tokens = n_spec;
    const int64_t vocab = c_.vocab;
    o.sample = [vocab](const float* l, int64_t, int64_t) { return testing::argmax_row(l, vocab); };
    return o;
  }
  static void use_dynamic(EngineOptions& o, const GPTModel& m) {
    o.dynamic = true;
    const KvBlockPool probe(m.config(), m.partition(), 4, 1);
    StatusOr<DynamicBudget> b = testing::small_dynamic_budget(probe.block_bytes());  // blocks of 4 positions
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    o.budget = *b;
  }
  EngineResult run(const EngineOptions& o, GPTModel* m = nullptr) {
    StatusOr<EngineResult> r = run_inference_engine(m ? *m : *model_, prompts_, o);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() ? std::move(r).value() : EngineResult();
  }
  ModelConfig c_;
  OpTable ops_;
  std::unique_ptr<GPTModel> model_, gpt_;
  std::vector<std::vector<int32_t>> prompts_;
};

TEST_F(SpeculativeDecodingTest, GreedyTokensAreThoseWithoutDraftsAndAcceptedDraftsMatchAReplay) {
  const int64_t max_new = 12;
  for (GPTModel* model : {model_.get(), gpt_.get()})
  for (bool dynamic : {false, true}) {
    SCOPED_TRACE(model == gpt_.get() ? "GPT" : "LLaMA");
    EngineOptions base = greedy(max_new, 0);
    if (dynamic) use_dynamic(base, *model);
    const EngineResult plain = run(base, model);
    EXPECT_EQ(plain.drafted, 0);
    for (int64_t n : {1, 2}) {
      EngineOptions o = base;
      o.num_speculative_tokens = n;
      const int64_t before = host_allocator().current_bytes();
      const EngineResult r = run(o, model);
      EXPECT_EQ(host_allocator().current_bytes(), before);
      ASSERT_EQ(r.generated.size(), prompts_.size());
      int64_t accepted = 0, drafted = 0;
      for (size_t i = 0; i < prompts_.size(); ++i) {
        EXPECT_EQ(r.generated[i], plain.generated[i]) << "prompt " << i << " N " << n << " dynamic " << dynamic;
        const Replay want = replay(*model, prompts_[i], plain.generated[i], n, max_new);
        EXPECT_EQ(r.drafted_per_request[i], want.drafted) << "prompt " << i << " N " << n << " dynamic " << dynamic;
        EXPECT_EQ(r.accepted_per_request[i], want.accepted) << "prompt " << i << " N " << n << " dynamic " << dynamic;
        accepted += r.accepted_per_request[i];
        drafted += r.drafted_per_request[i];
      }
      EXPECT_EQ(r.accepted_drafts, accepted);
      EXPECT_EQ(r.drafted, drafted);
      // Both paths run: some drafts accepted, some rejected.
      EXPECT_GT(r.accepted_drafts, 0) << "N " << n;
      EXPECT_LT(r.accepted_drafts, r.drafted) << "N " << n;
      // Static batches: a batch runs until its slowest request ends, which accepted drafts can only
      // bring forward. (Dynamic batching may run more steps: a decoding request's N + 1 rows count
      // against the step's tokens, so fewer prompts join per step.)
      if (!dynamic) EXPECT_LE(r.steps, plain.steps) << "N " << n;
      if (dynamic) {
        EXPECT_EQ(r.free_blocks_at_end, r.num_blocks);
        EXPECT_GT(r.rewound_blocks, 0) << "N " << n;
      }
    }
  }
}

// Sampling (temperature 1 over the whole vocabulary) with a fixed seed: the draw of generated token
// s of request q is u(seed, q, s), whether its step verified drafts or not, so every emitted token
// (the main model's sample of its row) is the one N = 0 emits: the sampled tokens are identical.
TEST_F(SpeculativeDecodingTest, SampledTokensWithAFixedSeedAreThoseWithoutDrafts) {
  const int64_t vocab = c_.vocab;
  const auto sampler = [vocab](const float* l, int64_t q, int64_t s) {
    const float mx = *std::max_element(l, l + vocab);
    double total = 0.0;
    for (int64_t v = 0; v < vocab; ++v) total += std::exp(static_cast<double>(l[v] - mx));
    double u = uniform_at(2024, static_cast<uint64_t>(q), static_cast<uint64_t>(s)) * total;
    for (int64_t v = 0; v < vocab; ++v) {
      u -= std::exp(static_cast<double>(l[v] - mx));
      if (u <= 0.0) return static_cast<int32_t>(v);
    }
    return static_cast<int32_t>(vocab - 1);
  };
  EngineOptions base = greedy(12, 0);
  base.sample = sampler;
  const EngineResult plain = run(base);
  for (int64_t n : {1, 2}) {
    EngineOptions o = base;
    o.num_speculative_tokens = n;
    const EngineResult r = run(o);
    ASSERT_EQ(r.generated.size(), prompts_.size());
    for (size_t i = 0; i < prompts_.size(); ++i) EXPECT_EQ(r.generated[i], plain.generated[i]) << "prompt " << i;
    EXPECT_GT(r.accepted_drafts, 0) << "N " << n;
    EXPECT_LT(r.accepted_drafts, r.drafted) << "N " << n;
  }
}

// KV rollback: a request feeds three drafts after its prompt, keeps one (rewind_kv_blocks gives
// back the block that held only the rejected ones), then feeds another token: its logits are those
// of the sequence without the rejected drafts.
TEST_F(SpeculativeDecodingTest, RollbackDropsTheRejectedDraftsKeysAndBlocks) {
  const std::vector<int32_t> prompt = testing::test_prompt(7, c_.vocab);
  KvBlockPool pool(c_, model_->partition(), 4, 6);
  RaggedKvBatch rb;
  rb.pool = &pool;
  RaggedRequest rr;
  rr.blocks = pool.allocate(3);  // 10 positions: 7 + 3 drafts
  rr.rows = 7;
  rb.requests = {rr};
  (void)model_->forward_logits_ragged(prompt, rb);
  rb.requests[0].cached = 7;
  rb.requests[0].rows = 3;  // a token and two drafts at positions 7, 8, 9 (the third block)
  (void)model_->forward_logits_ragged({3, 5, 6}, rb);
  // Keep position 7 (the token) and 8 (an accepted draft): positions [0, 9) need 3 blocks.
  EXPECT_EQ(rewind_kv_blocks(pool, rb.requests[0].blocks, 9), 0);
  // Keep only position 7: positions [0, 8) need 2 blocks; the third goes back.
  EXPECT_EQ(rewind_kv_blocks(pool, rb.requests[0].blocks, 8), 1);
  EXPECT_EQ(rb.requests[0].blocks.size(), 2u);
  EXPECT_EQ(pool.free_blocks(), 4);
  // Position 8 again, another token, with a fresh third block: the rejected drafts left nothing.
  const std::vector<int32_t> more = pool.allocate(1);
  rb.requests[0].blocks.push_back(more[0]);
  rb.requests[0].cached = 8;
  rb.requests[0].rows = 1;
  const Tensor got = model_->forward_logits_ragged({1}, rb);
  std::vector<int32_t> kept = prompt;
  kept.insert(kept.end(), {3, 1});
  const std::vector<float> want = testing::full_forward_last_logits(*model_, kept);
  EXPECT_LT(testing::logits_rel_diff(got.data<float>(), want), 1e-5);
  // And the rejected continuation's logits differ (the check can tell them apart).
  std::vector<int32_t> rejected = prompt;
  rejected.insert(rejected.end(), {3, 5, 1});
  const std::vector<float> other = testing::full_forward_last_logits(*model_, rejected);
  EXPECT_GT(testing::logits_rel_diff(got.data<float>(), other), 1e-3);
  pool.release(rb.requests[0].blocks);
}

// The drafting MTP layers are the trained ones: at a sequence's first position (where the training
// forward's causal attention, like the one-position draft, sees only itself) the cross-entropy of
// mtp_single_position's logits of depth 1 and 2, fed the decoder's hidden state and the next tokens
// by hand, is the MTP loss the training forward logs (loss mask on that position only).
TEST_F(SpeculativeDecodingTest, DraftLogitsAreTheTrainingMtpLayersAtTheFirstPosition) {
  const int64_t B = 3, S = 6, V = c_.vocab, H = c_.hidden;
  MicroBatch mb;
  mb.B = B;
  mb.S = S;
  for (int64_t b = 0; b < B; ++b) {
    const std::vector<int32_t> t = testing::test_prompt(S + b, V);  // different tokens per sample
    for (int64_t s = 0; s < S; ++s) {
      mb.tokens.push_back(t[static_cast<size_t>(s)]);
      mb.labels.push_back(static_cast<int32_t>((5 * s + 3 * b + 1) % V));
      mb.position_ids.push_back(static_cast<int32_t>(s));
    }
  }
  // By hand: h_0 at position 0, then MTP layer k takes token k + 1 at position k + 1, label k + 1.
  Tensor h = Tensor::empty({B, H});
  for (int64_t b = 0; b < B; ++b) {
    const std::vector<int32_t> ids(mb.tokens.begin() + b * S, mb.tokens.begin() + (b + 1) * S);
    std::copy_n(whole_sequence_hidden(*model_, ids).data<float>(), H, h.data<float>() + b * H);
  }
  std::vector<double> want;
  for (int64_t k = 0; k < 2; ++k) {
    std::vector<int32_t> ids, pos;
    for (int64_t b = 0; b < B; ++b) {
      ids.push_back(mb.tokens[static_cast<size_t>(b * S + k + 1)]);
      pos.push_back(static_cast<int32_t>(k + 1));
    }
    Tensor h_next, logits;
    model_->mtp_single_position(k, h, ids, pos, &h_next, &logits);
    double ce = 0.0;
    for (int64_t b = 0; b < B; ++b) {
      const float* l = logits.data<float>() + b * V;
      const double mx = *std::max_element(l, l + V);
      double se = 0.0;
      for (int64_t v = 0; v < V; ++v) se += std::exp(static_cast<double>(l[v]) - mx);
      ce += mx + std::log(se) - l[mb.labels[static_cast<size_t>(b * S + k + 1)]];
    }
    want.push_back(ce / static_cast<double>(B));
    h = h_next;
  }
  for (int64_t k = 0; k < 2; ++k) {
    MicroBatch m = mb;
    m.loss_mask.assign(static_cast<size_t>(B * S), 0.0f);
    // Rolled left k + 1 times by the training forward: row 0 of each sample.
    for (int64_t b = 0; b < B; ++b) m.loss_mask[static_cast<size_t>(b * S + k + 1)] = 1.0f;
    GPTModel::LossSums sums;
    model_->take_mtp_losses();
    model_->forward(k, m, Tensor(), /*training=*/true, &sums);
    const std::vector<double> got = model_->take_mtp_losses();
    ASSERT_EQ(got.size(), 2u);
    const double w = want[static_cast<size_t>(k)];
    EXPECT_NEAR(got[static_cast<size_t>(k)], w, 1e-5 * std::abs(w)) << "MTP layer " << k;
  }
}

TEST_F(SpeculativeDecodingTest, RefusalsNameTheFlag) {
  const auto error = [&](GPTModel& m, const EngineOptions& o) {
    StatusOr<EngineResult> r = run_inference_engine(m, prompts_, o);
    return r.ok() ? std::string("ok") : r.status().message();
  };
  EngineOptions o = greedy(4, 3);
  EXPECT_EQ(error(*model_, o),
            "--num-speculative-tokens 3: must be less than or equal to the number of MTP layers (--mtp-num-layers 2): "
            "MTP layer k drafts the k-th token");
  o.num_speculative_tokens = -1;
  EXPECT_EQ(error(*model_, o), "--num-speculative-tokens: expected a non-negative integer, found -1");
  o.num_speculative_tokens = 2;
  o.dynamic = true;
  o.budget.block_tokens = 2;
  EXPECT_EQ(error(*model_, o), "--num-speculative-tokens (2) must be < --inference-dynamic-batching-block-size (2)");
  ModelConfig plain = c_;
  plain.mtp_num_layers = 0;
  const std::unique_ptr<GPTModel> no_mtp = testing::decoding_model(plain, &ops_, 11);
  EXPECT_EQ(error(*no_mtp, greedy(4, 1)),
            "--num-speculative-tokens 1 needs a model with multi-token prediction layers (--mtp-num-layers, as the "
            "checkpoint was trained with); found none");
}

// A Gated DeltaNet model (G * G G *) and a hybrid Mamba model (M * - M * M), each with MTP layers
// (built directly: the flags still refuse both with --mtp-num-layers): their recurrent states roll
// back to the last accepted row (model/mamba_state.h step buffers), so greedy N = 1, 2 give the
// tokens of N = 0 on prompts of different lengths, static and dynamic, and the accepted drafts are
// the hand replay's; every state slot comes back, and the slots hold N + 1 step buffers besides
// the state.
class RecurrentSpeculativeDecodingTest : public SpeculativeDecodingTest,
                                         public ::testing::WithParamInterface<std::string> {};

TEST_P(RecurrentSpeculativeDecodingTest, StatesRollBackToTheLastAcceptedRow) {
  const bool mamba = GetParam() == "mamba";
  ModelConfig g = mamba ? testing::tiny_hybrid_config() : testing::tiny_gdn_config();
  g.vocab = 8;
  g.max_positions = kMaxLength;
  g.mtp_num_layers = 2;
  // The hybrid pattern names the MTP layers' kind too (global layers 6 and 7): attention, as the
  // GDN model's MTP layers are.
  if (mamba) g.hybrid.layers += "**";
  const std::unique_ptr<GPTModel> gdn = testing::decoding_model(g, &ops_, 11);
  (mamba ? testing::make_mamba_state_carry : testing::make_gdn_state_carry)(*gdn);
  const int64_t max_new = 12;
  for (bool dynamic : {false, true}) {
    SCOPED_TRACE(dynamic ? "dynamic" : "static");
    EngineOptions base = greedy(max_new, 0);
    if (dynamic) use_dynamic(base, *gdn);
    const EngineResult plain = run(base, gdn.get());
    ASSERT_GT(plain.mamba_state_bytes, 0);
    for (int64_t n : {1, 2}) {
      EngineOptions o = base;
      o.num_speculative_tokens = n;
      const int64_t before = host_allocator().current_bytes();
      const EngineResult r = run(o, gdn.get());
      EXPECT_EQ(host_allocator().current_bytes(), before);
      ASSERT_EQ(r.generated.size(), prompts_.size());
      for (size_t i = 0; i < prompts_.size(); ++i) {
        EXPECT_EQ(r.generated[i], plain.generated[i]) << "prompt " << i << " N " << n;
        const Replay want = replay(*gdn, prompts_[i], plain.generated[i], n, max_new);
        EXPECT_EQ(r.drafted_per_request[i], want.drafted) << "prompt " << i << " N " << n;
        EXPECT_EQ(r.accepted_per_request[i], want.accepted) << "prompt " << i << " N " << n;
      }
      EXPECT_GT(r.accepted_drafts, 0) << "N " << n;
      EXPECT_LT(r.accepted_drafts, r.drafted) << "N " << n;  // rejections: the rollback ran
      EXPECT_EQ(r.mamba_state_bytes, (n + 2) * plain.mamba_state_bytes);
      if (dynamic) {
        EXPECT_EQ(r.free_mamba_slots_at_end, r.mamba_slots);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, RecurrentSpeculativeDecodingTest, ::testing::Values("gdn", "mamba"));

}  // namespace
}  // namespace gale
