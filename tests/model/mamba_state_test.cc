// The Mamba layers' decoding state (model/mamba_state.h): prefill + single-token steps against a
// float64 numpy golden of mamba_ssm's causal_conv1d_update / selective_state_update
// (tools/reference/mamba_step_reference.py), and a tiny hybrid model (M * - M * M, and M * E M * M
// with a MoE layer) whose cached greedy decoding — batch 1 and 2, beams branching off a cache — gives
// the tokens and, within 1e-4 relative, the logits of rerunning the whole sequence each step.
#include "model/mamba_state.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kernels/cpu/gemm.h"
#include "model/decoding_check.h"
#include "model/hybrid_test_model.h"
#include "model/kv_cache.h"
#include "model/mamba_mixer.h"
#include "testing_json.h"

namespace gale {
namespace {

// Two samples: their prompts (5 and 2 positions) prefilled in one ragged pass from fresh slots, then
// 4 decode steps of both together, one position each; outputs and final states against the golden,
// which ran every position as one step.
TEST(MambaStateGolden, PrefillThenStepsMatchTheSingleTokenRecurrence) {
  std::ifstream in(std::string(GALE_TEST_DATA_DIR) + "/reference/mamba/step_golden.json");
  ASSERT_TRUE(in.good());
  const nlohmann::json g = nlohmann::json::parse(in);
  const auto& dims = g["dims"];
  ModelConfig c;
  c.num_layers = 1;
  c.hidden = dims["H"];
  c.rms_norm = true;
  c.hybrid.enabled = true;
  c.hybrid.layers = "M";
  c.hybrid.headdim = dims["headdim"];
  c.hybrid.ngroups = dims["ngroups"];
  c.hybrid.d_state = dims["d_state"];
  c.hybrid.d_conv = dims["d_conv"];
  ASSERT_EQ(c.hybrid.expand, dims["expand"].get<int64_t>());
  const MambaDims d = MambaDims::of(c);
  ParamBuffer pb;
  const MambaParamIds w = register_mamba_params(pb, c, 0);
  pb.finalize();
  const std::vector<std::pair<const char*, int>> params = {
      {"w_in", w.in_proj}, {"conv_w", w.conv_w}, {"conv_b", w.conv_b}, {"a_log", w.a_log},
      {"d", w.d}, {"dt_bias", w.dt_bias}, {"norm_w", w.gnorm_w}, {"w_out", w.out_proj}};
  ASSERT_NO_FATAL_FAILURE(testing::set_params_from_json(pb, params, g["inputs"]));
  const MambaMixerWeights mw = mamba_mixer_weights(pb, w, sgemm, gemm_bf16);
  const auto& samples = g["samples"];
  const int64_t B = static_cast<int64_t>(samples.size()), H = d.H, decode = dims["decode"];
  MambaStatePool pool(c, single_process_partition(c), B);
  std::vector<int64_t> slot, prompt;
  std::vector<std::vector<float>> u, out;
  for (const auto& s : samples) {
    slot.push_back(pool.allocate());
    prompt.push_back(s["prompt"]);
    u.push_back(testing::json_floats(s["u"]));
    out.push_back(testing::json_floats(s["out"]));
  }
  // Prefill: sample b's prompt rows after sample b − 1's.
  std::vector<MambaSequence> seqs;
  int64_t rows = 0;
  for (int64_t b = 0; b < B; ++b) {
    seqs.push_back(MambaSequence{rows, 1, prompt[b], pool.conv(0, slot[b]), pool.ssm(0, slot[b])});
    rows += prompt[b];
  }
  Tensor x = Tensor::empty({rows, H});
  for (int64_t b = 0; b < B; ++b)
    std::copy_n(u[b].data(), prompt[b] * H, x.data<float>() + seqs[b].first * H);
  Tensor y = mamba_mixer_forward_sequences(d, mw, x, seqs, DType::kF32);
  for (int64_t b = 0; b < B; ++b)
    testing::expect_near_reference(y.data<float>() + seqs[b].first * H, std::vector<float>(out[b].begin(), out[b].begin() + prompt[b] * H),
                 "prefill of sample " + std::to_string(b));
  // Decode: one row per sample, rows t = b.
  for (int64_t k = 0; k < decode; ++k) {
    Tensor xs = Tensor::empty({B, H});
    std::vector<MambaSequence> steps;
    for (int64_t b = 0; b < B; ++b) {
      std::copy_n(u[b].data() + (prompt[b] + k) * H, H, xs.data<float>() + b * H);
      steps.push_back(MambaSequence{b, 1, 1, pool.conv(0, slot[b]), pool.ssm(0, slot[b])});
    }
    Tensor ys = mamba_mixer_forward_sequences(d, mw, xs, steps, DType::kF32);
    for (int64_t b = 0; b < B; ++b)
      testing::expect_near_reference(ys.data<float>() + b * H,
                   std::vector<float>(out[b].begin() + (prompt[b] + k) * H, out[b].begin() + (prompt[b] + k + 1) * H),
                   "decode step " + std::to_string(k) + " of sample " + std::to_string(b));
  }
  for (int64_t b = 0; b < B; ++b) {
    testing::expect_near_reference(pool.conv(0, slot[b]), testing::json_floats(samples[b]["conv_state"]), "conv state " + std::to_string(b));
    testing::expect_near_reference(pool.ssm(0, slot[b]), testing::json_floats(samples[b]["ssm_state"]), "ssm state " + std::to_string(b));
  }
  // Slots: a released slot comes back zeroed.
  pool.release(slot[0]);
  const int64_t again = pool.allocate();
  EXPECT_EQ(again, slot[0]);
  for (int64_t i = 0; i < (d.K - 1) * d.conv_dim(); ++i) ASSERT_EQ(pool.conv(0, again)[i], 0.0f);
  for (int64_t i = 0; i < d.NH * d.P * d.N; ++i) ASSERT_EQ(pool.ssm(0, again)[i], 0.0f);
}

class HybridDecodeTest : public testing::DecodingModelTest {
 protected:
  virtual ModelConfig config() const { return testing::tiny_hybrid_config(); }
  void SetUp() override { set_up(config(), testing::make_mamba_state_carry); }
};

// Prompts of 1, 2, 3 (< d_conv: the conv state keeps zeros from before position 0), 7 and 19 positions,
// one sample each (one state slot), then two samples of 6 together (B = 2: sample b's state in slot b).
TEST_F(HybridDecodeTest, CachedGreedyDecodingEqualsTheFullForwardEachStep) {
  EXPECT_EQ(make_kv_cache(c_, model_->partition(), 1, c_.max_positions).mamba.slots(), 1);
  const KvCache cache = testing::expect_greedy_decoding_of_prompts(
      *model_, {1, 2, 3, 7, 19}, {{5, 9, 11, 2, 40, 7}, {33, 1, 8, 8, 60, 21}});
  // Only the attention layers ('*': layers 1 and 4) keep keys and values.
  for (int64_t l = 0; l < c_.num_layers; ++l) EXPECT_EQ(cache.layers[l].defined(), l == 1 || l == 4) << l;
}

// A MoE layer ('E', top-2 of 4 experts with a shared expert) in the MLP layer's place: it keeps no
// decoding state (each token routes alone), and the cached decoding still equals the full forward.
class HybridMoeDecodeTest : public HybridDecodeTest {
 protected:
  ModelConfig config() const override { return testing::tiny_hybrid_moe_config(); }
};

TEST_F(HybridMoeDecodeTest, CachedGreedyDecodingEqualsTheFullForwardEachStep) {
  const KvCache cache =
      testing::expect_greedy_decoding_of_prompts(*model_, {}, {{5, 9, 11, 2, 40, 7}, {33, 1, 8, 8, 60, 21}});
  for (int64_t l = 0; l < c_.num_layers; ++l) EXPECT_EQ(cache.layers[l].defined(), l == 1 || l == 4) << l;
  EXPECT_GE(model_->params().find("decoder.layers.2.mlp.router.weight"), 0);
}

// Beam search's branching: a cache cloned after the prompt continues on its own (the clone's Mamba
// states are its own).
TEST_F(HybridDecodeTest, ClonedCachesBranchIndependently) {
  testing::expect_cloned_caches_branch_independently(*model_, {4, 17, 23, 9, 1, 50, 3, 12}, 6, 70);
}

}  // namespace
}  // namespace gale
