// Gemma (v1) models from MindSpeed-LLM's flags (ModelConfig::geglu, rmsnorm_offset,
// input_embeds_scale): finite-difference gradients of every parameter, and each flag against the
// plain model it is equivalent to.
#include <gtest/gtest.h>

#include <cmath>

#include "model/gpt_model.h"
#include "model_test_batches.h"
#include "testing.h"

namespace gale {
namespace {

using testing::random_vector;

// Gemma-shaped: RMSNorm with the unit offset, GeGLU, √H embedding scale, RoPE, no biases, tied
// embeddings, head_dim 12 independent of H/NH = 8, GQA 2/1 (Gemma-2B's MQA).
ModelConfig gemma_config(bool tanh) {
  ModelConfig c = testing::gradcheck_gpt_config();
  c.rms_norm = true;
  c.rmsnorm_offset = true;
  c.geglu = true;
  c.openai_gelu = tanh;
  c.input_embeds_scale = 4.0f;  // √16
  c.position = PositionEmbedding::kRope;
  c.add_bias_linear = false;
  c.tied_embeddings = true;
  c.head_dim = 12;
  c.kv_heads = 1;
  c.init_std = 0.1f;  // × √H at the input: keep the activations O(1)
  return c;
}

TEST(GemmaModel, EveryParameterMatchesFiniteDifferencesTanhGeglu) {
  testing::expect_every_parameter_matches_finite_differences(gemma_config(true));
}

TEST(GemmaModel, EveryParameterMatchesFiniteDifferencesErfGegluWithBiases) {
  ModelConfig c = gemma_config(false);
  c.add_bias_linear = true;  // fc1's bias through GeGLU's backward
  c.tied_embeddings = false;
  testing::expect_every_parameter_matches_finite_differences(c);
}

// Copies every parameter of `from` into `to` (same names and shapes), through `f(name, value)`.
template <class F>
void copy_params(GPTModel& from, GPTModel& to, F f) {
  ParamBuffer& a = from.params();
  ParamBuffer& b = to.params();
  ASSERT_EQ(a.size(), b.size());
  for (int id = 0; id < a.size(); ++id) {
    const ParamSpec& s = a.spec(id);
    ASSERT_EQ(b.spec(id).name, s.name);
    for (int64_t i = 0; i < s.local_numel(); ++i) b.param_data(id)[i] = f(s.name, a.param_data(id)[i]);
  }
}

bool is_norm_weight(const std::string& name) { return name.find("layernorm.weight") != std::string::npos; }

// --add-rmsnorm-offset: every RMSNorm weight starts at 1 (MindSpeed-LLM's init, so the scale is 2),
// and the model computes what the plain model computes with weights 1 + w, with the same gradients.
TEST(GemmaModel, RmsnormOffsetIsThePlainModelWithOnePlusWeights) {
  ModelConfig c = gemma_config(true);
  c.qk_layernorm = true;
  ModelConfig plain_c = c;
  plain_c.rmsnorm_offset = false;
  OpTable ops = reference_ops();
  GPTModel offset(c, single_process_partition(c), &ops), plain(plain_c, single_process_partition(plain_c), &ops);
  offset.params().initialize(7);
  int norms = 0;
  for (int id = 0; id < offset.params().size(); ++id) {
    const ParamSpec& s = offset.params().spec(id);
    if (!is_norm_weight(s.name)) continue;
    ++norms;
    for (int64_t i = 0; i < s.local_numel(); ++i) EXPECT_EQ(offset.params().param_data(id)[i], 1.0f) << s.name;
    const auto w = random_vector(s.local_numel(), 300 + id, 0.3f);
    std::copy(w.begin(), w.end(), offset.params().param_data(id));
  }
  EXPECT_EQ(norms, 4 * c.num_layers + 1);  // input, pre-MLP, q and k norms of each layer, and the final norm
  copy_params(offset, plain, [](const std::string& name, float v) { return is_norm_weight(name) ? 1.0f + v : v; });
  MicroBatch mb = testing::masked_batch(c, 2, 9, false);
  EXPECT_EQ(testing::mean_loss(offset, mb, true), testing::mean_loss(plain, mb, true));
  const ParamBuffer& a = offset.params();
  for (int64_t i = 0; i < a.numel(); ++i)
    ASSERT_EQ(a.flat_grads().data<float>()[i], plain.params().flat_grads().data<float>()[i]) << i;
}

// --input-embeds-norm with an untied output layer: scaling the embedding's output by s is the
// plain model with word embeddings s·E (the loss to rounding), and the gradient of E is s times the
// plain model's gradient of its (scaled) embeddings.
TEST(GemmaModel, InputEmbedsScaleIsThePlainModelWithScaledEmbeddings) {
  ModelConfig c = gemma_config(false);
  c.tied_embeddings = false;
  c.input_embeds_scale = 4.0f;  // a power of two: s·E is exact
  ModelConfig plain_c = c;
  plain_c.input_embeds_scale = 1.0f;
  OpTable ops = reference_ops();
  GPTModel scaled(c, single_process_partition(c), &ops), plain(plain_c, single_process_partition(plain_c), &ops);
  scaled.params().initialize(11);
  const std::string emb = "embedding.word_embeddings.weight";
  copy_params(scaled, plain, [&](const std::string& name, float v) { return name == emb ? 4.0f * v : v; });
  MicroBatch mb = testing::masked_batch(c, 2, 5, false);
  const double ls = testing::mean_loss(scaled, mb, true), lp = testing::mean_loss(plain, mb, true);
  EXPECT_EQ(ls, lp);
  const ParamBuffer& a = scaled.params();
  const ParamBuffer& b = plain.params();
  for (int id = 0; id < a.size(); ++id) {
    const float k = a.spec(id).name == emb ? 4.0f : 1.0f;
    for (int64_t i = 0; i < a.spec(id).local_numel(); ++i)
      ASSERT_EQ(a.grad_data(id)[i], k * b.grad_data(id)[i]) << a.spec(id).name << "[" << i << "]";
  }
  // And it changes the model: the same weights without the scale give another loss.
  copy_params(scaled, plain, [](const std::string&, float v) { return v; });
  EXPECT_GT(std::fabs(testing::mean_loss(plain, mb, false) - ls), 1e-3);
}

}  // namespace
}  // namespace gale
