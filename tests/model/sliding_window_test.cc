// Sliding-window attention in the model (ModelConfig::sliding_window, --sliding-window): a window
// covering the sequence is no window, a shorter one changes training, each layer widens the
// receptive field by W − 1 positions, and the flash kernel trains as the reference with the window.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/cpu/fused_ops.h"
#include "model_test_batches.h"
#include "tiny_model_training.h"

namespace gale {
namespace {

ModelConfig windowed(ModelConfig c, int64_t window) {
  c.sliding_window = window;
  return c;
}

TEST(SlidingWindow, WindowCoveringTheSequenceIsNoWindow) {
  const OpTable ops = reference_ops();
  for (bool documents : {false, true}) {
    const ModelConfig c = testing::tiny_llama_config();  // seq_length 70
    const testing::TinyTrainingRun plain = testing::train_tiny(c, ops, documents, 2);
    testing::expect_identical_runs(plain, testing::train_tiny(windowed(c, 70), ops, documents, 2), "window 70");
    testing::expect_identical_runs(plain, testing::train_tiny(windowed(c, 1000), ops, documents, 2), "window 1000");
  }
}

TEST(SlidingWindow, ShorterWindowChangesTheLoss) {
  const OpTable ops = reference_ops();
  const ModelConfig c = testing::tiny_llama_config();
  const double plain = testing::train_plain(c, ops, 1).losses[0];
  const double w69 = testing::train_plain(windowed(c, 69), ops, 1).losses[0];  // hides only key 0 from query 69
  const double w8 = testing::train_plain(windowed(c, 8), ops, 1).losses[0];
  EXPECT_NE(plain, w69);
  EXPECT_GT(std::fabs(plain - w8), 1e-4);
}

// With L layers and window W, the logits at position p depend on the tokens p − L·(W − 1) .. p only.
TEST(SlidingWindow, ReceptiveFieldGrowsByWMinusOnePerLayer) {
  const OpTable ops = reference_ops();
  const ModelConfig c = windowed(testing::tiny_llama_config(), 5);  // 2 layers: field 1 + 2·4 = 9
  GPTModel model(c, single_process_partition(c), &ops);
  model.params().initialize(3);
  const int64_t S = 20;
  std::vector<int32_t> tokens;
  for (int64_t i = 0; i < S; ++i) tokens.push_back(static_cast<int32_t>((i * 29 + 5) % c.vocab));
  const Tensor before = model.forward_logits(testing::position_slice(tokens, 1, S, 0, S), Tensor());
  tokens[3] = (tokens[3] + 1) % static_cast<int32_t>(c.vocab);
  const Tensor after = model.forward_logits(testing::position_slice(tokens, 1, S, 0, S), Tensor());
  for (int64_t s = 0; s < S; ++s) {
    double d = 0.0;
    for (int64_t v = 0; v < c.vocab; ++v)
      d = std::max(d, std::fabs(double(before.data<float>()[s * c.vocab + v]) - after.data<float>()[s * c.vocab + v]));
    if (s >= 3 && s <= 3 + 2 * 4)
      EXPECT_GT(d, 1e-6) << "position " << s << " is within reach of token 3";
    else
      EXPECT_EQ(d, 0.0) << "position " << s << " is out of reach of token 3";
  }
}

TEST(SlidingWindow, FlashTrainsAsTheReference) {
  OpTable flash = reference_ops();
  GALE_CHECK_OK(install_fused_kernel(flash, "attention", detected_isa()));
  for (bool documents : {false, true}) {
    const ModelConfig c = windowed(testing::tiny_gpt_config(), 23);  // with attention dropout
    const testing::TinyTrainingRun ref = testing::train_tiny(c, reference_ops(), documents, 2);
    const testing::TinyTrainingRun got = testing::train_tiny(c, flash, documents, 2);
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

}  // namespace
}  // namespace gale
