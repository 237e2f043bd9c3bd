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
#include <functional>
#include <nlohmann/json.hpp>

#include "kernels/cpu/fused_ops.h"
#include "kernels/cpu/gemm.h"
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
  const std::pair<const char*, int> params[] = {{"w_in", w.in_proj}, {"conv_w", w.conv_w}, {"conv_b", w.conv_b},
                                                {"a_log", w.a_log},  {"d", w.d},           {"dt_bias", w.dt_bias},
                                                {"norm_w", w.gnorm_w}, {"w_out", w.out_proj}};
  for (const auto& [name, id] : params) {
    const std::vector<float> v = testing::json_floats(g["inputs"][name]);
    ASSERT_EQ(static_cast<int64_t>(v.size()), pb.spec(id).local_numel()) << name;
    pb.set_param_values(id, v.data());
  }
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

class HybridDecodeTest : public ::testing::Test {
 protected:
  virtual ModelConfig config() const { return testing::tiny_hybrid_config(); }
  void SetUp() override {
    c_ = config();
    ops_ = reference_ops();
    GALE_CHECK_OK(install_all_fused_kernels(ops_, detected_isa()));
    model_ = std::make_unique<GPTModel>(c_, single_process_partition(c_), &ops_);
    model_->params().initialize(7);
    testing::make_mamba_state_carry(*model_);
  }
  // forward_logits of the next tokens of each of cache.B samples ([B, n] ids) -> rows [B][V] of the last.
  std::vector<std::vector<float>> cached(KvCache& cache, const std::vector<std::vector<int32_t>>& ids) {
    MicroBatch mb;
    mb.B = static_cast<int64_t>(ids.size());
    mb.S = static_cast<int64_t>(ids[0].size());
    for (const auto& v : ids) mb.tokens.insert(mb.tokens.end(), v.begin(), v.end());
    mb.position_ids.assign(mb.tokens.size(), 0);
    const Tensor l = model_->forward_logits(mb, Tensor(), &cache);
    std::vector<std::vector<float>> rows;
    for (int64_t b = 0; b < mb.B; ++b) {
      const float* r = l.data<float>() + (b * mb.S + mb.S - 1) * c_.vocab;
      rows.emplace_back(r, r + c_.vocab);
    }
    return rows;
  }
  ModelConfig c_;
  OpTable ops_;
  std::unique_ptr<GPTModel> model_;
};

// Greedy decoding of B samples (prompts of equal length) with a KvCache: every step's logits against
// the whole-sequence forward of that sample's tokens so far; returns the largest relative difference.
using CachedRun = std::function<std::vector<std::vector<float>>(KvCache&, const std::vector<std::vector<int32_t>>&)>;
double greedy_against_full_forward(GPTModel& m, const std::vector<std::vector<int32_t>>& prompts, int64_t steps,
                                   KvCache& cache, const CachedRun& run) {
  std::vector<std::vector<int32_t>> seqs = prompts;
  std::vector<std::vector<int32_t>> next = prompts;
  double worst = 0.0;
  for (int64_t k = 0; k <= steps; ++k) {
    const std::vector<std::vector<float>> rows = run(cache, next);
    for (size_t b = 0; b < seqs.size(); ++b) {
      const std::vector<float> want = testing::full_forward_last_logits(m, seqs[b]);
      worst = std::max(worst, testing::logits_rel_diff(rows[b].data(), want));
      const int32_t tok = testing::argmax_row(rows[b].data(), m.config().vocab);
      EXPECT_EQ(tok, testing::argmax_row(want.data(), m.config().vocab)) << "sample " << b << ", step " << k;
      seqs[b].push_back(tok);
      next[b] = {tok};
    }
  }
  return worst;
}

// Prompts of 1, 2, 3 (< d_conv: the conv state keeps zeros from before position 0), 7 and 19 positions,
// one sample each, then two samples of 6 together (B = 2: sample b's state in slot b).
TEST_F(HybridDecodeTest, CachedGreedyDecodingEqualsTheFullForwardEachStep) {
  auto run = [&](KvCache& cache, const std::vector<std::vector<int32_t>>& ids) { return cached(cache, ids); };
  for (int64_t len : {1, 2, 3, 7, 19}) {
    std::vector<int32_t> p;
    for (int64_t i = 0; i < len; ++i) p.push_back(static_cast<int32_t>((len * 13 + i * 7 + 3) % c_.vocab));
    KvCache cache = make_kv_cache(c_, model_->partition(), 1, c_.max_positions);
    EXPECT_EQ(cache.mamba.slots(), 1);
    const double worst = greedy_against_full_forward(*model_, {p}, 12, cache, run);
    EXPECT_LT(worst, 1e-4) << "prompt of " << len;
    std::printf("prompt of %lld: largest relative logits difference %.2e\n", static_cast<long long>(len), worst);
  }
  const std::vector<std::vector<int32_t>> two = {{5, 9, 11, 2, 40, 7}, {33, 1, 8, 8, 60, 21}};
  KvCache cache = make_kv_cache(c_, model_->partition(), 2, c_.max_positions);
  EXPECT_LT(greedy_against_full_forward(*model_, two, 12, cache, run), 1e-4);
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
  auto run = [&](KvCache& cache, const std::vector<std::vector<int32_t>>& ids) { return cached(cache, ids); };
  const std::vector<std::vector<int32_t>> two = {{5, 9, 11, 2, 40, 7}, {33, 1, 8, 8, 60, 21}};
  KvCache cache = make_kv_cache(c_, model_->partition(), 2, c_.max_positions);
  const double worst = greedy_against_full_forward(*model_, two, 12, cache, run);
  EXPECT_LT(worst, 1e-4);
  std::printf("largest relative logits difference %.2e\n", worst);
  for (int64_t l = 0; l < c_.num_layers; ++l) EXPECT_EQ(cache.layers[l].defined(), l == 1 || l == 4) << l;
  EXPECT_GE(model_->params().find("decoder.layers.2.mlp.router.weight"), 0);
}

// Beam search's branching (train/generate.cc): a cache cloned after the prompt continues with other
// tokens than the original; both give the full forward's logits (the clone's Mamba states are its own).
TEST_F(HybridDecodeTest, ClonedCachesBranchIndependently) {
  const std::vector<int32_t> prompt = {4, 17, 23, 9, 1, 50, 3, 12};
  KvCache a = make_kv_cache(c_, model_->partition(), 1, c_.max_positions);
  cached(a, {prompt});
  KvCache b = clone_kv_cache(a);
  std::vector<int32_t> sa = prompt, sb = prompt;
  for (int k = 0; k < 6; ++k) {
    const int32_t ta = static_cast<int32_t>(10 + k), tb = static_cast<int32_t>(70 - 3 * k);
    sa.push_back(ta);
    sb.push_back(tb);
    const std::vector<float> ra = cached(a, {{ta}})[0];
    const std::vector<float> rb = cached(b, {{tb}})[0];
    EXPECT_LT(testing::logits_rel_diff(ra.data(), testing::full_forward_last_logits(*model_, sa)), 1e-4) << k;
    EXPECT_LT(testing::logits_rel_diff(rb.data(), testing::full_forward_last_logits(*model_, sb)), 1e-4) << k;
  }
}

}  // namespace
}  // namespace gale
