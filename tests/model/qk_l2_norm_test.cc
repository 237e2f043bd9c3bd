// --qk-l2-norm on standard (MHA/GQA) attention in one process: finite-difference gradients of every
// parameter, no q/k norm parameters, the attention scores independent of the scale of q and k
// (what the norm is for), the reference kernels against every fused kernel (levels 0 and 2), and
// decoding with the KV cache against the whole-sequence forward.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/fused_ops.h"
#include "model/decoding_check.h"
#include "model/gpt_model.h"
#include "model/kv_cache.h"
#include "testing.h"
#include "model_test_batches.h"
#include "tiny_model_training.h"

namespace gale {
namespace {

// testing::small_gqa_rope_config with --qk-l2-norm.
ModelConfig l2_config(bool llama) {
  ModelConfig c = testing::small_gqa_rope_config(llama);
  c.qk_l2_norm = true;
  return c;
}

class QkL2NormGrad : public ::testing::TestWithParam<bool> {};

TEST_P(QkL2NormGrad, EveryParameterMatchesFiniteDifferences) {
  testing::expect_every_parameter_matches_finite_differences(l2_config(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(Architectures, QkL2NormGrad, ::testing::Values(true, false),
                         [](const auto& info) { return std::string(info.param ? "llama" : "gpt"); });

TEST(QkL2Norm, HasNoNormParameters) {
  const ModelConfig c = l2_config(false);
  OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  ModelConfig plain = c;
  plain.qk_l2_norm = false;
  GPTModel without(plain, single_process_partition(plain), &ops);
  EXPECT_EQ(model.params().size(), without.params().size());
  EXPECT_EQ(model.params().numel(), without.params().numel());
  for (int id = 0; id < model.params().size(); ++id) {
    const std::string& name = model.params().spec(id).name;
    EXPECT_EQ(name.find("q_layernorm"), std::string::npos) << name;
    EXPECT_EQ(name.find("k_layernorm"), std::string::npos) << name;
  }
}

// Each layer's linear_qkv (and its bias) scaled by 3 and its linear_proj by 1/3: the values, and so
// the attention output before linear_proj, grow by 3, and with the q/k heads L2-normalised the
// softmax is unchanged, so the logits are too; without the norm the scores grow 9-fold.
std::vector<float> logits_with_qkv_scaled(const ModelConfig& c, float a) {
  OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  model.params().initialize(11);
  ParamBuffer& pb = model.params();
  for (int id = 0; id < pb.size(); ++id) {
    const std::string& name = pb.spec(id).name;
    const bool qkv = name.find("linear_qkv.") != std::string::npos;
    const bool proj = name.find("linear_proj.weight") != std::string::npos;
    if (!qkv && !proj) continue;
    for (int64_t i = 0; i < pb.spec(id).local_numel(); ++i) pb.param_data(id)[i] *= qkv ? a : 1.0f / a;
  }
  const MicroBatch mb = testing::tiny_batch(c, 2, 9, /*documents=*/false);
  const Tensor logits = model.forward_logits(mb, Tensor());
  return std::vector<float>(logits.data<float>(), logits.data<float>() + logits.numel());
}

TEST(QkL2Norm, ScoresIgnoreTheScaleOfQueriesAndKeys) {
  for (bool llama : {true, false}) {
    ModelConfig c = l2_config(llama);
    c.norm_eps = 1e-10f;  // the norm's eps would otherwise tell the scales apart a little
    const std::vector<float> base = logits_with_qkv_scaled(c, 1.0f), scaled = logits_with_qkv_scaled(c, 3.0f);
    double scale = 0.0;
    for (float v : base) scale = std::max(scale, double(std::abs(v)));
    EXPECT_LT(testing::max_abs_diff(base, scaled), 1e-5 * scale) << (llama ? "llama" : "gpt");
    c.qk_l2_norm = false;  // the check can tell: without the norm the logits move
    EXPECT_GT(testing::max_abs_diff(logits_with_qkv_scaled(c, 1.0f), logits_with_qkv_scaled(c, 3.0f)), 1e-3 * scale);
  }
}

// The tiny Llama (S 70: two flash tiles, GQA 8/2, HD 12, half the head dims rotary) with the norm.
ModelConfig tiny_l2_config() {
  ModelConfig c = testing::tiny_llama_config();
  c.qk_l2_norm = true;
  return c;
}

// Level 0 (the reference kernels) against every fused kernel of this CPU (levels 1 and 2).
TEST(QkL2Norm, FusedKernelsMatchReference) {
  const ModelConfig c = tiny_l2_config();
  const ModelPartition part = single_process_partition(c);
  OpTable ref_ops = reference_ops(), fused_ops = testing::decoding_ops();
  GPTModel ref(c, part, &ref_ops), fused(c, part, &fused_ops);
  ref.params().initialize(3);
  fused.params().initialize(3);
  const MicroBatch mb = testing::tiny_batch(c, 2, 11, /*documents=*/true);
  const double l_ref = testing::mean_loss(ref, mb, true), l_fused = testing::mean_loss(fused, mb, true);
  EXPECT_NEAR(l_ref, l_fused, 1e-5 * std::abs(l_ref));
  testing::expect_close_grads(ref.params(), fused.params(), 1e-4, 1e-7);
  ModelConfig plain = c;  // and the norm changes the loss
  plain.qk_l2_norm = false;
  GPTModel without(plain, part, &ref_ops);
  without.params().initialize(3);
  EXPECT_GT(std::abs(testing::mean_loss(without, mb, false) - l_ref), 1e-4);
}

// The cache holds the keys after the norm and RoPE; decoding in chunks gives the whole-sequence logits.
TEST(QkL2Norm, KvCacheDecodingEqualsTheWholeSequenceForward) {
  const ModelConfig c = tiny_l2_config();
  OpTable ops = reference_ops();
  const ModelPartition part = single_process_partition(c);
  GPTModel model(c, part, &ops);
  model.params().initialize(5);
  const int64_t B = 2, S = 23;
  KvCache cache = make_kv_cache(c, part, B, S);
  testing::expect_chunked_decoding_equals_whole_forward(model, cache, model, testing::test_tokens(B * S, c.vocab), B,
                                                        S, {7, 1, 1, 5, 1, 8}, 2e-5);
}

}  // namespace
}  // namespace gale
