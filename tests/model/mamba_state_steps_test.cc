// Speculative decoding's rollback of recurrent states (model/mamba_state.h step buffers): a ragged
// verification forward of 4 rows that keeps its per-row states leaves, after row j, the state of
// decoding rows 0..j one row at a time (every Mamba or GDN layer, conv and SSM / delta-rule
// state), and a request rolled back to row j (keep_step) continues with the logits of the sequence
// without the rows after j — for a hybrid Mamba model (M * - M * M) and a Gated DeltaNet model
// (G * G G *). And the step buffers of the convolution alone against a hand computation.
#include "model/mamba_state.h"

#include <gtest/gtest.h>

#include <string>

#include "model/causal_conv1d.h"
#include "model/decoding_check.h"
#include "model/gdn_test_model.h"
#include "model/hybrid_test_model.h"
#include "model/kv_cache.h"

namespace gale {
namespace {

constexpr int64_t kSteps = 4;   // a token and 3 drafts
constexpr int64_t kPrompt = 7;

// One request's state while it decodes: its KV blocks and its state slot.
struct Seq {
  std::vector<int32_t> blocks;
  int64_t slot = -1, cached = 0;
};

// A ragged forward of `tokens` of one request; returns the last row's logits.
std::vector<float> feed(GPTModel& m, KvBlockPool& kv, MambaStatePool& states, Seq& q,
                        const std::vector<int32_t>& tokens, bool keep_steps) {
  RaggedKvBatch rb;
  rb.pool = &kv;
  rb.mamba = &states;
  RaggedRequest rr;
  rr.blocks = q.blocks;
  rr.cached = q.cached;
  rr.rows = static_cast<int64_t>(tokens.size());
  rr.mamba_slot = q.slot;
  rr.keep_steps = keep_steps;
  rb.requests.push_back(rr);
  const Tensor l = m.forward_logits_ragged(tokens, rb);
  q.cached += rr.rows;
  return std::vector<float>(l.data<float>(), l.data<float>() + l.numel());
}

Seq start(GPTModel& m, KvBlockPool& kv, MambaStatePool& states, const std::vector<int32_t>& prompt) {
  Seq q;
  q.blocks = kv.allocate(2);  // 32 positions
  q.slot = states.allocate();
  (void)feed(m, kv, states, q, prompt, false);
  return q;
}

void finish(KvBlockPool& kv, MambaStatePool& states, Seq& q) {
  kv.release(q.blocks);
  states.release(q.slot);
}

// The recurrent layers (local indices) of the model.
std::vector<int64_t> recurrent_layers(const ModelConfig& c) {
  std::vector<int64_t> r;
  for (int64_t l = 0; l < c.num_layers; ++l)
    if (c.hybrid.is_mamba_layer(l) || c.gdn.is_gdn_layer(l)) r.push_back(l);
  return r;
}

struct StateSizes {
  int64_t conv = 0, ssm = 0;
};
StateSizes sizes(const ModelConfig& c, int64_t layer) {
  MambaStatePool one(c, single_process_partition(c), 1, 2);
  return {one.conv_step(layer, 0, 1) - one.conv_step(layer, 0, 0), one.ssm_step(layer, 0, 1) - one.ssm_step(layer, 0, 0)};
}

double max_abs_diff(const float* a, const float* b, int64_t n) {
  double d = 0.0;
  for (int64_t i = 0; i < n; ++i) d = std::max(d, std::abs(static_cast<double>(a[i]) - b[i]));
  return d;
}

class StateStepsTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const bool mamba = GetParam() == "mamba";
    c_ = mamba ? testing::tiny_hybrid_config() : testing::tiny_gdn_config();
    ops_ = testing::decoding_ops();
    model_ = testing::decoding_model(c_, &ops_, 7);
    (mamba ? testing::make_mamba_state_carry : testing::make_gdn_state_carry)(*model_);
    prompt_ = testing::test_prompt(kPrompt, c_.vocab);
    rows_ = {5, 11, 2, 29};  // the token and three drafts
  }
  ModelConfig c_;
  OpTable ops_;
  std::unique_ptr<GPTModel> model_;
  std::vector<int32_t> prompt_, rows_;
};

// The verification forward's state after row j is the state a one-row-at-a-time decode of rows
// 0..j leaves. Both run the same recurrence on the same inputs; the inputs (the layers before)
// come from GEMMs over 4 rows or 1, so they agree to float rounding (stated bound: 1e-5 of the
// state's scale; in practice they are bit-identical or a few ulps apart).
TEST_P(StateStepsTest, StateAfterEachVerificationRowIsTheOneRowDecodeState) {
  KvBlockPool kv(c_, model_->partition(), 16, 4);
  MambaStatePool states(c_, model_->partition(), 2, kSteps);
  Seq spec = start(*model_, kv, states, prompt_), one = start(*model_, kv, states, prompt_);
  (void)feed(*model_, kv, states, spec, rows_, /*keep_steps=*/true);
  const std::vector<int64_t> layers = recurrent_layers(c_);
  ASSERT_FALSE(layers.empty());
  double worst = 0.0;
  for (int64_t j = 0; j < kSteps; ++j) {
    (void)feed(*model_, kv, states, one, {rows_[static_cast<size_t>(j)]}, false);
    for (int64_t l : layers) {
      const StateSizes n = sizes(c_, l);
      double scale = 1e-30;
      for (int64_t i = 0; i < n.ssm; ++i) scale = std::max(scale, std::abs(static_cast<double>(states.ssm(l, one.slot)[i])));
      for (int64_t i = 0; i < n.conv; ++i) scale = std::max(scale, std::abs(static_cast<double>(states.conv(l, one.slot)[i])));
      const double dc = max_abs_diff(states.conv_step(l, spec.slot, j), states.conv(l, one.slot), n.conv) / scale;
      const double ds = max_abs_diff(states.ssm_step(l, spec.slot, j), states.ssm(l, one.slot), n.ssm) / scale;
      EXPECT_LT(dc, 1e-5) << "layer " << l << " row " << j << " conv";
      EXPECT_LT(ds, 1e-5) << "layer " << l << " row " << j << " ssm";
      worst = std::max({worst, dc, ds});
      // The rows differ: the state after row j is not the one after row j − 1.
      if (j > 0) {
        EXPECT_GT(max_abs_diff(states.ssm_step(l, spec.slot, j), states.ssm_step(l, spec.slot, j - 1), n.ssm), 1e-4);
      }
    }
  }
  // The last step is the slot's own state (the forward left it there).
  for (int64_t l : layers) {
    const StateSizes n = sizes(c_, l);
    EXPECT_EQ(max_abs_diff(states.ssm_step(l, spec.slot, kSteps - 1), states.ssm(l, spec.slot), n.ssm), 0.0);
    EXPECT_EQ(max_abs_diff(states.conv_step(l, spec.slot, kSteps - 1), states.conv(l, spec.slot), n.conv), 0.0);
  }
  std::printf("%s: worst relative state difference %.3g\n", GetParam().c_str(), worst);
  finish(kv, states, spec);
  finish(kv, states, one);
}

// Rolled back to row j (rows j + 1.. rejected; keep_step(j), cached = prompt + j + 1), the request
// continues as the sequence without the rejected rows; without the rollback it does not.
TEST_P(StateStepsTest, RollbackToRowJContinuesAsTheSequenceWithoutTheRejectedRows) {
  const int32_t next = 17;
  for (int64_t j = 0; j < kSteps - 1; ++j) {
    SCOPED_TRACE("rolled back to row " + std::to_string(j));
    KvBlockPool kv(c_, model_->partition(), 16, 4);
    MambaStatePool states(c_, model_->partition(), 2, kSteps);
    Seq spec = start(*model_, kv, states, prompt_), stale = start(*model_, kv, states, prompt_);
    (void)feed(*model_, kv, states, spec, rows_, true);
    (void)feed(*model_, kv, states, stale, rows_, true);
    states.keep_step(spec.slot, j);
    spec.cached = stale.cached = kPrompt + j + 1;  // the KV rollback
    const std::vector<float> got = feed(*model_, kv, states, spec, {next}, false);
    const std::vector<float> no_rollback = feed(*model_, kv, states, stale, {next}, false);
    std::vector<int32_t> kept = prompt_;
    kept.insert(kept.end(), rows_.begin(), rows_.begin() + j + 1);
    kept.push_back(next);
    const std::vector<float> want = testing::full_forward_last_logits(*model_, kept);
    EXPECT_LT(testing::logits_rel_diff(got.data(), want), 1e-5);
    EXPECT_GT(testing::logits_rel_diff(no_rollback.data(), want), 1e-3);  // the check can tell
    finish(kv, states, spec);
    finish(kv, states, stale);
  }
}

INSTANTIATE_TEST_SUITE_P(Recurrent, StateStepsTest, ::testing::Values("mamba", "gdn"));

// The convolution's step buffers by hand: K = 3, C = 2, an old state and 3 new inputs; the state
// after position s holds the last two inputs up to s (from the old state before position 0),
// bit-exact (copies), and the final state is the last step.
TEST(ConvSteps, StateAfterEachPositionIsTheLastInputsUpToIt) {
  const int64_t K = 3, C = 2;
  const std::vector<float> x = {1, 2, 3, 4, 5, 6};          // positions 0, 1, 2
  const std::vector<float> w = {0.5f, -1, 2, 1, 0.25f, 3};  // [C, K]
  std::vector<float> state = {-1, -2, -3, -4};                // inputs at positions −2, −1
  std::vector<float> steps(3 * (K - 1) * C, 99.0f), y(3 * C);
  causal_conv1d_forward_sequences(x.data(), C, w.data(), nullptr, y.data(), C, K,
                                  {ConvSequence{0, 1, 3, state.data(), steps.data()}});
  const std::vector<float> want = {-3, -4, 1, 2,   // after position 0: positions −1, 0
                                   1, 2, 3, 4,     // after 1: 0, 1
                                   3, 4, 5, 6};    // after 2: 1, 2
  EXPECT_EQ(steps, want);
  EXPECT_EQ(state, std::vector<float>(want.end() - 4, want.end()));
  // The outputs are unchanged by keeping the steps: channel 0 at position 0 is 0.5·(−1) − 1·(−3) + 2·1.
  EXPECT_FLOAT_EQ(y[0], 0.5f * -1 - 1 * -3 + 2 * 1);
}

// keep_step copies step j of every layer into the slot and leaves the other slots alone.
TEST(MambaStateSteps, KeepStepCopiesOneStepOfEveryLayer) {
  const ModelConfig c = testing::tiny_hybrid_config();
  MambaStatePool p(c, single_process_partition(c), 2, 3);
  EXPECT_EQ(p.steps(), 3);
  EXPECT_EQ(p.slot_bytes(), 4 * MambaStatePool(c, single_process_partition(c), 2).slot_bytes());
  const int64_t a = p.allocate(), b = p.allocate();
  const std::vector<int64_t> layers = recurrent_layers(c);
  for (int64_t l : layers) {
    const StateSizes n = sizes(c, l);
    for (int64_t j = 0; j < 3; ++j) {
      std::fill_n(p.conv_step(l, a, j), n.conv, static_cast<float>(10 * l + j));
      std::fill_n(p.ssm_step(l, a, j), n.ssm, static_cast<float>(-10 * l - j));
    }
    std::fill_n(p.ssm(l, b), n.ssm, 7.0f);
  }
  p.keep_step(a, 1);
  for (int64_t l : layers) {
    const StateSizes n = sizes(c, l);
    EXPECT_EQ(p.conv(l, a)[0], static_cast<float>(10 * l + 1));
    EXPECT_EQ(p.conv(l, a)[n.conv - 1], static_cast<float>(10 * l + 1));
    EXPECT_EQ(p.ssm(l, a)[n.ssm - 1], static_cast<float>(-10 * l - 1));
    EXPECT_EQ(p.ssm(l, b)[0], 7.0f);
  }
}

}  // namespace
}  // namespace gale
