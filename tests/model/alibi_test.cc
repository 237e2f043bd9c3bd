// ALiBi in the model (PositionEmbedding::kAlibi, --position-embedding-type alibi): no position
// parameters, a bias that changes training, and the flash kernel trains as the reference with it
// (with documents, a sliding window and attention dropout). The golden logits are in
// tests/golden (llama_alibi*), parallel layouts in tests/parallel/alibi_invariance_mpi_test.cc,
// decoding in tests/model/kv_cache_test.cc.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/cpu/fused_ops.h"
#include "model_test_batches.h"
#include "tiny_model_training.h"

namespace gale {
namespace {

ModelConfig with_position(ModelConfig c, PositionEmbedding position, int64_t window = 0) {
  c.position = position;
  c.sliding_window = window;
  return c;
}

TEST(Alibi, NoPositionParametersAndTheBiasChangesTheLoss) {
  const OpTable ops = reference_ops();
  const ModelConfig none = with_position(testing::tiny_gpt_config(), PositionEmbedding::kNone);
  const ModelConfig alibi = with_position(testing::tiny_gpt_config(), PositionEmbedding::kAlibi);
  GPTModel a(none, single_process_partition(none), &ops), b(alibi, single_process_partition(alibi), &ops);
  EXPECT_EQ(a.params().size(), b.params().size());
  EXPECT_EQ(b.params().find("embedding.position_embeddings.weight"), -1);
  const double loss_none = testing::train_plain(none, ops, 1).losses[0];
  const double loss_alibi = testing::train_plain(alibi, ops, 1).losses[0];
  EXPECT_GT(std::fabs(loss_none - loss_alibi), 1e-4);
}

TEST(Alibi, FlashTrainsAsTheReference) {
  OpTable flash = reference_ops();
  GALE_CHECK_OK(install_fused_kernel(flash, "attention", detected_isa()));
  for (int64_t window : {0, 23})
    for (bool documents : {false, true}) {
      // GPT-like with attention dropout; 3 heads: not a power of two (interleaved slopes).
      const ModelConfig c = with_position(testing::tiny_gpt_config(), PositionEmbedding::kAlibi, window);
      const testing::TinyTrainingRun ref = testing::train_tiny(c, reference_ops(), documents, 2);
      const testing::TinyTrainingRun got = testing::train_tiny(c, flash, documents, 2);
      for (size_t s = 0; s < ref.losses.size(); ++s)
        EXPECT_LE(std::fabs(got.losses[s] - ref.losses[s]) / ref.losses[s], 1e-5) << "step " << s + 1;
      double err = 0.0, peak = 0.0;
      for (size_t i = 0; i < ref.grads[0].size(); ++i) {
        err = std::max(err, std::fabs(double(got.grads[0][i]) - ref.grads[0][i]));
        peak = std::max(peak, std::fabs(double(ref.grads[0][i])));
      }
      EXPECT_LE(err / peak, 1e-4) << "window " << window << (documents ? ", documents" : "");
    }
}

}  // namespace
}  // namespace gale
