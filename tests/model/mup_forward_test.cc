// --use-mup in the model (model/config.h MupConfig): finite-difference gradients through the
// embedding and output multipliers and the µP softmax scale, each of them changing the logits as
// Megatron's formulas say, and the embeddings (and an untied output layer) initialised with the
// unscaled σ while the hidden weights take the model's init_std.
#include <gtest/gtest.h>

#include <cmath>

#include "model/gpt_model.h"
#include "model_test_batches.h"
#include "testing.h"
#include "tiny_model_training.h"

namespace gale {
namespace {

// Multipliers far from 1 (and from each other) so that a missing or doubled one shows.
ModelConfig with_mup(ModelConfig c) {
  c.mup.enabled = true;
  c.mup.width_mult = 2.0;
  c.mup.embedding_mult = 1.7f;
  c.mup.output_mult = 0.6f;
  c.mup.softmax_scale = 0.8f / static_cast<float>(c.head_dim);
  c.mup.embedding_init_std = 2.0f * c.init_std;
  return c;
}

class MupGrad : public ::testing::TestWithParam<bool> {};

TEST_P(MupGrad, EveryParameterMatchesFiniteDifferences) {
  const ModelConfig c = GetParam() ? with_mup(testing::small_gqa_rope_config(true)) : with_mup(testing::gradcheck_gpt_config());
  testing::expect_every_parameter_matches_finite_differences(c);
}

INSTANTIATE_TEST_SUITE_P(Architectures, MupGrad, ::testing::Values(true, false),
                         [](const auto& info) { return std::string(info.param ? "llama" : "gpt"); });

std::vector<float> logits_of(const ModelConfig& c) {
  OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  model.params().initialize(11);
  const MicroBatch mb = testing::tiny_batch(c, 2, 9, /*documents=*/false);
  const Tensor logits = model.forward_logits(mb, Tensor());
  return std::vector<float>(logits.data<float>(), logits.data<float>() + logits.numel());
}

// The output multiplier scales the logits exactly (up to f32 rounding); the embedding multiplier
// and the softmax scale change them (and only a µP model has them: multipliers 1 and no scale
// give the plain model's logits bit for bit).
TEST(Mup, MultipliersActOnTheLogits) {
  const ModelConfig plain = testing::gradcheck_gpt_config();
  ModelConfig identity = plain;
  identity.mup.enabled = true;  // multipliers 1, no softmax scale, no embedding init std
  EXPECT_EQ(logits_of(plain), logits_of(identity));
  ModelConfig out = plain;
  out.mup.output_mult = 0.25f;
  const std::vector<float> a = logits_of(plain), b = logits_of(out);
  double worst = 0.0, scale = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(0.25 * a[i] - b[i]));
    scale = std::max(scale, std::abs(double(a[i])));
  }
  EXPECT_LT(worst, 1e-6 * scale);
  ModelConfig emb = plain;
  emb.mup.embedding_mult = 2.0f;
  EXPECT_GT(testing::max_abs_diff(a, logits_of(emb)), 1e-3 * scale);
  ModelConfig soft = plain;
  soft.mup.softmax_scale = 1.0f / static_cast<float>(plain.head_dim);  // 1/HD instead of 1/√HD
  EXPECT_EQ(soft.softmax_scale(), 1.0f / static_cast<float>(plain.head_dim));
  EXPECT_GT(testing::max_abs_diff(a, logits_of(soft)), 1e-4 * scale);
}

// MLA keeps its own softmax scale (Megatron's MLA ignores config.softmax_scale).
TEST(Mup, MlaKeepsItsSoftmaxScale) {
  ModelConfig c = testing::gradcheck_gpt_config();
  c.mup.softmax_scale = 0.01f;
  EXPECT_EQ(c.softmax_scale(), 0.01f);
  c.mla.enabled = true;
  c.mla.qk_head_dim = 8;
  c.mla.qk_pos_emb_head_dim = 4;
  EXPECT_EQ(c.softmax_scale(), c.mla.softmax_scale());
}

// The word and position embeddings and an untied output layer draw N(0, embedding_init_std), the
// hidden matrices N(0, init_std) (and the output projections init_std/√(2L)).
TEST(Mup, EmbeddingsKeepTheUnscaledInit) {
  ModelConfig c = testing::gradcheck_gpt_config();
  c.tied_embeddings = false;
  c.mup.embedding_init_std = 3.0f * c.init_std;
  OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  const ParamBuffer& pb = model.params();
  int checked = 0;
  for (int id = 0; id < pb.size(); ++id) {
    const ParamSpec& s = pb.spec(id);
    if (s.init != InitKind::kNormal) continue;
    const bool embedding = s.name.rfind("embedding.", 0) == 0 || s.name == "output_layer.weight";
    const bool out_proj = s.name.find("linear_proj.weight") != std::string::npos ||
                          s.name.find("linear_fc2.weight") != std::string::npos;
    const float want = embedding ? c.mup.embedding_init_std
                                 : out_proj ? c.init_std / std::sqrt(2.0f * static_cast<float>(c.num_layers))
                                            : c.init_std;
    EXPECT_FLOAT_EQ(s.init_std, want) << s.name;
    checked += embedding;
  }
  EXPECT_EQ(checked, 3);  // word, position, output layer
}

}  // namespace
}  // namespace gale
