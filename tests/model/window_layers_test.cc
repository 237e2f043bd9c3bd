// Per-layer sliding windows (--window-size with --window-attn-skip-freq; ModelConfig::window_layers):
// every layer marked is the uniform window, none marked is full attention, a mixed pattern is
// neither; its gradients match finite differences, the flash kernel trains as the reference, and
// KV-cache decoding keeps each layer's own mask.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/cpu/fused_ops.h"
#include "model/decoding_check.h"
#include "model/gpt_model.h"
#include "model/mla_test_config.h"
#include "model_test_batches.h"
#include "testing.h"
#include "tiny_model_training.h"

namespace gale {
namespace {

// gradcheck_gpt_config (2 layers, S 8) with a window of 3 positions in the layers marked 1.
ModelConfig windowed(std::vector<int> layers, int64_t window = 3) {
  ModelConfig c = testing::gradcheck_gpt_config();
  c.attention_dropout = c.hidden_dropout = 0.0f;
  c.sliding_window = window;
  c.window_layers = std::move(layers);
  return c;
}

TEST(WindowLayers, LayerWindowFollowsThePattern) {
  const ModelConfig c = windowed({1, 0});
  EXPECT_EQ(c.layer_window(0), 3);
  EXPECT_EQ(c.layer_window(1), 0);
  EXPECT_EQ(c.common_window(), 0);  // the union of the masks is full causal attention
  EXPECT_EQ(windowed({1, 1}).common_window(), 3);
  EXPECT_EQ(windowed({}).layer_window(1), 3);
}

TEST(WindowLayers, AllMarkedIsTheUniformWindowAndNoneMarkedIsFullAttention) {
  const MicroBatch mb = testing::masked_batch(windowed({}), 2, 7, false);
  ModelConfig full = windowed({});
  full.sliding_window = 0;
  EXPECT_EQ(testing::max_abs_diff(testing::reference_logits(windowed({1, 1}), mb), testing::reference_logits(windowed({}), mb)), 0.0);
  EXPECT_EQ(testing::max_abs_diff(testing::reference_logits(windowed({0, 0}), mb), testing::reference_logits(full, mb)), 0.0);
}

TEST(WindowLayers, AMixedPatternIsNeitherUniformNorFull) {
  const MicroBatch mb = testing::masked_batch(windowed({}), 2, 7, false);
  const std::vector<float> all = testing::reference_logits(windowed({1, 1}), mb), none = testing::reference_logits(windowed({0, 0}), mb),
                           first = testing::reference_logits(windowed({1, 0}), mb), second = testing::reference_logits(windowed({0, 1}), mb);
  EXPECT_GT(testing::max_abs_diff(first, all), 1e-3);
  EXPECT_GT(testing::max_abs_diff(first, none), 1e-3);
  EXPECT_GT(testing::max_abs_diff(first, second), 1e-3);
}

TEST(WindowLayers, EveryParameterMatchesFiniteDifferences) {
  testing::expect_every_parameter_matches_finite_differences(windowed({0, 1}));
}

TEST(WindowLayers, KvCacheDecodingEqualsTheWholeSequenceForward) {
  testing::expect_reference_model_decoding_equals_whole_forward(windowed({1, 0}));
  testing::expect_reference_model_decoding_equals_whole_forward(windowed({0, 1}, 2));
}

// The flash kernel (level 2's attention) with a window in the first of three layers only, with
// attention dropout and with document masks: the losses and gradients of the reference.
TEST(WindowLayers, FlashTrainsAsTheReference) {
  OpTable flash = reference_ops();
  GALE_CHECK_OK(install_fused_kernel(flash, "attention", detected_isa()));
  for (bool documents : {false, true}) {
    ModelConfig c = testing::three_layers(testing::tiny_gpt_config());
    c.sliding_window = 23;
    c.window_layers = {1, 0, 1};
    const testing::TinyTrainingRun ref = testing::train_tiny(c, reference_ops(), documents, 2);
    const testing::TinyTrainingRun got = testing::train_tiny(c, flash, documents, 2);
    ModelConfig uniform = c;
    uniform.window_layers.clear();
    EXPECT_NE(testing::train_tiny(uniform, reference_ops(), documents, 1).losses[0], ref.losses[0]);
    for (size_t s = 0; s < ref.losses.size(); ++s)
      EXPECT_LE(std::fabs(got.losses[s] - ref.losses[s]) / ref.losses[s], 1e-5) << "step " << s + 1;
    double err = 0.0, peak = 0.0;
    for (size_t i = 0; i < ref.grads[0].size(); ++i) {
      err = std::max(err, std::fabs(double(got.grads[0][i]) - ref.grads[0][i]));
      peak = std::max(peak, std::fabs(double(ref.grads[0][i])));
    }
    EXPECT_LE(err / peak, 1e-4) << (documents ? "documents" : "plain");
  }
}

// MLA takes the same per-layer problem: a mixed pattern is neither the uniform window nor full
// attention, its gradients match finite differences, and decoding equals the whole forward.
TEST(WindowLayers, MlaLayersTakeTheirOwnWindow) {
  const auto mla = [](std::vector<int> layers) {
    ModelConfig c = testing::mla_config(/*llama=*/true, /*q_lora_rank=*/0, /*qk_layernorm=*/false, 3);
    c.attention_dropout = c.hidden_dropout = 0.0f;
    c.sliding_window = 3;
    c.window_layers = std::move(layers);
    return c;
  };
  const MicroBatch mb = testing::masked_batch(mla({}), 2, 7, false);
  const std::vector<float> all = testing::reference_logits(mla({1, 1}), mb), none = testing::reference_logits(mla({0, 0}), mb),
                           first = testing::reference_logits(mla({1, 0}), mb);
  EXPECT_EQ(testing::max_abs_diff(all, testing::reference_logits(mla({}), mb)), 0.0);
  EXPECT_GT(testing::max_abs_diff(first, all), 1e-3);
  EXPECT_GT(testing::max_abs_diff(first, none), 1e-3);
  testing::expect_every_parameter_matches_finite_differences(mla({0, 1}));
  testing::expect_reference_model_decoding_equals_whole_forward(mla({1, 0}));
}

}  // namespace
}  // namespace gale
