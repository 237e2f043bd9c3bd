// Decoding with Gated DeltaNet layers (model/gated_delta_net.h gdn_forward_sequences, their state
// in model/mamba_state.h): the shared causal convolution continued from its state equals the whole
// sequence's; the mixer's prefill then single-token steps equal its whole-sequence forward; and a
// tiny model with GDN and attention layers (G * G G *) decoded greedily with a KvCache — batch 1 and
// 2, beams branching off a cache — gives the tokens and, within 1e-4 relative, the logits of
// rerunning the whole sequence each step; Gated DeltaNet-2 layers (gdn2) decode the same way.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "kernels/cpu/gemm.h"
#include "model/causal_conv1d.h"
#include "model/decoding_check.h"
#include "model/gated_delta_net.h"
#include "model/gdn_test_model.h"
#include "model/kv_cache.h"
#include "testing.h"

namespace gale {
namespace {

// Two sequences of 9 and 2 positions (2 < K − 1: the state keeps inputs from before position 0) in
// rows of stride 3 of a wider buffer, once whole and once as a prefill of 4 and 1 positions then
// single rows: the same outputs bit for bit, and the states hold the last K − 1 inputs.
TEST(CausalConv1dSequences, ContinuingFromTheStateEqualsTheWholeSequence) {
  const int64_t C = 5, K = 4, stride = 7;
  const std::vector<int64_t> len = {9, 2};
  std::vector<float> w(static_cast<size_t>(C * K)), bias(static_cast<size_t>(C));
  testing::fill_random(w.data(), C * K, 1);
  testing::fill_random(bias.data(), C, 2);
  std::vector<std::vector<float>> x(2), whole(2);
  for (size_t i = 0; i < 2; ++i) {
    x[i].resize(static_cast<size_t>(len[i] * stride));
    testing::fill_random(x[i].data(), len[i] * stride, 3 + i);
    whole[i].resize(static_cast<size_t>(len[i] * C));
    causal_conv1d_forward(x[i].data(), stride, w.data(), bias.data(), whole[i].data(), C, K, len[i], 1);
  }
  std::vector<std::vector<float>> state(2, std::vector<float>(static_cast<size_t>((K - 1) * C), 0.0f));
  std::vector<int64_t> done = {0, 0};
  for (const std::vector<int64_t>& step : {std::vector<int64_t>{4, 1}, {1, 1}, {1, 0}, {1, 0}, {1, 0}, {1, 0}}) {
    // The step's rows: sequence 0's then sequence 1's, copied into one buffer of stride `stride`.
    std::vector<float> rows(static_cast<size_t>((step[0] + step[1]) * stride));
    std::vector<ConvSequence> seqs;
    int64_t r = 0;
    for (size_t i = 0; i < 2; ++i) {
      std::copy_n(x[i].data() + done[i] * stride, step[i] * stride, rows.data() + r * stride);
      seqs.push_back(ConvSequence{r, 1, step[i], state[i].data()});
      r += step[i];
    }
    check_conv_sequences(seqs, r, "test");
    std::vector<float> y(static_cast<size_t>(r * C));
    causal_conv1d_forward_sequences(rows.data(), stride, w.data(), bias.data(), y.data(), C, K, seqs);
    for (size_t i = 0; i < 2; ++i) {
      for (int64_t s = 0; s < step[i]; ++s)
        for (int64_t c = 0; c < C; ++c)
          ASSERT_EQ(y[static_cast<size_t>((seqs[i].first + s) * C + c)],
                    whole[i][static_cast<size_t>((done[i] + s) * C + c)])
              << "sequence " << i << " position " << done[i] + s << " channel " << c;
      done[i] += step[i];
      for (int64_t j = 0; j < K - 1; ++j) {  // row j: the input at position done − (K − 1) + j (zero before 0)
        const int64_t pos = done[i] - (K - 1) + j;
        for (int64_t c = 0; c < C; ++c)
          ASSERT_EQ(state[i][static_cast<size_t>(j * C + c)], pos >= 0 ? x[i][static_cast<size_t>(pos * stride + c)] : 0.0f)
              << "sequence " << i << " state row " << j;
      }
    }
  }
  EXPECT_EQ(done, len);
}

ModelConfig mixer_config(bool gdn2 = false) {
  ModelConfig c;
  c.num_layers = 1;
  c.hidden = 24;
  c.rms_norm = true;
  c.gdn.enabled = true;
  c.gdn.pattern = {gdn2 ? 2 : 1};
  c.gdn.num_key_heads = 2;
  c.gdn.num_value_heads = 4;
  c.gdn.key_head_dim = 8;
  c.gdn.value_head_dim = 6;
  c.gdn.conv_kernel = 4;
  return c;
}

// Two samples of 11 positions: gdn_forward over both, against a ragged prefill of 6 and 2 positions
// from fresh states, then steps of one or two rows per sample (none for sample 0 at the end).
void expect_prefill_then_steps_equal_the_whole_sequence(bool gdn2) {
  const ModelConfig c = mixer_config(gdn2);
  const GdnDims d = GdnDims::of(c);
  ParamBuffer pb;
  const GdnParamIds ids = register_gdn_params(pb, c, 0);
  pb.finalize();
  pb.initialize(5);
  {  // a decay that keeps the state (as make_gdn_state_carry)
    std::vector<float> v(static_cast<size_t>(pb.spec(ids.a_log).local_numel()), -1.2f);
    pb.set_param_values(ids.a_log, v.data());
  }
  const GdnWeights w = gdn_weights(c, pb, ids, sgemm, gemm_bf16);
  const int64_t S = 11, B = 2, H = d.H;
  Tensor u = Tensor::empty({S * B, H});
  testing::fill_random(u.data<float>(), S * B * H, 9);
  const Tensor whole = gdn_forward(d, w, u, S, B, DType::kF32, nullptr);  // rows s·B + b
  MambaStatePool pool(c, single_process_partition(c), B);
  const int64_t slot[2] = {pool.allocate(), pool.allocate()};
  int64_t done[2] = {0, 0};
  double worst = 0.0, scale = 0.0;
  for (int64_t i = 0; i < whole.numel(); ++i) scale = std::max(scale, std::abs(static_cast<double>(whole.data<float>()[i])));
  auto step = [&](int64_t n0, int64_t n1) {
    const int64_t n[2] = {n0, n1};
    Tensor x = Tensor::empty({n0 + n1, H});
    std::vector<GdnSequence> seqs;
    int64_t r = 0;
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t s = 0; s < n[b]; ++s)
        std::copy_n(u.data<float>() + ((done[b] + s) * B + b) * H, H, x.data<float>() + (r + s) * H);
      seqs.push_back(GdnSequence{r, 1, n[b], pool.conv(0, slot[b]), pool.ssm(0, slot[b])});
      r += n[b];
    }
    const Tensor y = gdn_forward_sequences(d, w, x, seqs, DType::kF32);
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t s = 0; s < n[b]; ++s)
        for (int64_t j = 0; j < H; ++j)
          worst = std::max(worst, std::abs(static_cast<double>(y.data<float>()[(seqs[b].first + s) * H + j]) -
                                           whole.data<float>()[((done[b] + s) * B + b) * H + j]));
      done[b] += n[b];
    }
  };
  step(6, 2);
  step(1, 2);
  step(1, 2);
  for (int k = 0; k < 3; ++k) step(1, 1);
  step(0, 2);  // a sequence without rows keeps its state
  EXPECT_EQ(done[0], S);
  EXPECT_EQ(done[1], S);
  EXPECT_LT(worst, 1e-5 * scale) << "largest difference " << worst << " of outputs up to " << scale;
}

TEST(GdnDecode, PrefillThenStepsEqualTheWholeSequenceForward) { expect_prefill_then_steps_equal_the_whole_sequence(false); }

// Gated DeltaNet-2 (--experimental-attention-variant gdn2) keeps the same states.
TEST(GdnDecode, Gdn2PrefillThenStepsEqualTheWholeSequenceForward) {
  expect_prefill_then_steps_equal_the_whole_sequence(true);
}

class GdnModelDecodeTest : public testing::DecodingModelTest {
 protected:
  void SetUp() override { set_up(testing::tiny_gdn_config(), testing::make_gdn_state_carry); }
};

// Prompts of 1, 2, 3 (< K − 1: the conv state keeps zeros from before position 0), 7 and 19
// positions, one sample each (one state slot), then two samples of 6 together (sample b's state in slot b).
TEST_F(GdnModelDecodeTest, CachedGreedyDecodingEqualsTheFullForwardEachStep) {
  EXPECT_EQ(make_kv_cache(c_, model_->partition(), 1, c_.max_positions).mamba.slots(), 1);
  const KvCache cache = testing::expect_greedy_decoding_of_prompts(
      *model_, {1, 2, 3, 7, 19}, {{5, 9, 11, 2, 40, 7}, {33, 1, 8, 8, 60, 21}});
  // Only the attention layers (1 and 4) keep keys and values; the three GDN layers a state each:
  // conv (K − 1)·(2·NK·DK + NV·DV) and the delta rule's NV·DK·DV floats.
  for (int64_t l = 0; l < c_.num_layers; ++l) EXPECT_EQ(cache.layers[l].defined(), l == 1 || l == 4) << l;
  EXPECT_EQ(cache.mamba.slot_bytes(), 3 * (3 * (2 * 2 * 8 + 4 * 6) + 4 * 8 * 6) * 4);
}

// Beam search's branching: a cache cloned after the prompt continues on its own (the clone's GDN
// states are its own).
TEST_F(GdnModelDecodeTest, ClonedCachesBranchIndependently) {
  testing::expect_cloned_caches_branch_independently(*model_, {4, 17, 23, 9, 1, 50, 3, 12}, 6, 70);
}

// The same model with Gated DeltaNet-2 layers (pattern entries 2): its states decode as GDN's.
class Gdn2ModelDecodeTest : public testing::DecodingModelTest {
 protected:
  void SetUp() override {
    ModelConfig c = testing::tiny_gdn_config();
    for (int& k : c.gdn.pattern) k *= 2;
    set_up(c, testing::make_gdn_state_carry);
  }
};

TEST_F(Gdn2ModelDecodeTest, CachedGreedyDecodingEqualsTheFullForwardEachStep) {
  testing::expect_greedy_decoding_of_prompts(*model_, {1, 3, 19}, {{5, 9, 11, 2, 40, 7}, {33, 1, 8, 8, 60, 21}});
}

}  // namespace
}  // namespace gale
