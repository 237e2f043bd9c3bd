// --softmax-type (model/config.h SoftmaxType; attention sinks): the learnable logits' parameter
// (Megatron's name, shape, init, no weight decay), finite differences of a small model with each type,
// and KV-cache decoding (whole-prompt, one-token and flash-decode steps) against the whole forward;
// the same in a hybrid Mamba model's attention layers, a Gated DeltaNet model's and with multi-latent
// attention.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "model/decoding_check.h"
#include "model/gdn_test_model.h"
#include "model/hybrid_test_model.h"
#include "model/mla_test_config.h"
#include "model/gpt_model.h"
#include "model/kv_cache.h"
#include "model_test_batches.h"
#include "testing.h"
#include "tiny_model_training.h"

namespace gale {
namespace {

ModelConfig sink_config(SoftmaxType type) {
  ModelConfig c = testing::gradcheck_gpt_config();
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 4;
  c.position = PositionEmbedding::kRope;
  c.softmax_type = type;
  c.attention_dropout = c.hidden_dropout = 0.0f;
  return c;
}

const char* kOffset = "decoder.layers.1.self_attention.core_attention.softmax_offset";

TEST(SoftmaxType, LearnableRegistersOneLogitPerHeadAsMegatron) {
  const ModelConfig c = sink_config(SoftmaxType::kLearnable);
  OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  const int id = model.params().find(kOffset);
  ASSERT_GE(id, 0);
  const ParamSpec& s = model.params().spec(id);
  EXPECT_EQ(s.global_shape, (Shape{c.heads}));
  EXPECT_FALSE(s.weight_decay);  // 1-D: Megatron's no-weight-decay rule
  EXPECT_EQ(s.init, InitKind::kNormal);  // Megatron's init_method
  EXPECT_EQ(s.init_std, c.init_std);
  EXPECT_EQ(s.split_dim, 0);  // split over TP with the heads
  model.params().initialize(3);
  const float* v = model.params().param_data(id);
  double sq = 0.0;
  for (int64_t h = 0; h < c.heads; ++h) sq += double{v[h]} * v[h];
  EXPECT_GT(sq, 0.0);
  for (SoftmaxType t : {SoftmaxType::kVanilla, SoftmaxType::kOffByOne}) {  // no parameter (off-by-one: zeros)
    const ModelConfig o = sink_config(t);
    GPTModel m(o, single_process_partition(o), &ops);
    EXPECT_LT(m.params().find(kOffset), 0);
    EXPECT_EQ(m.params().numel(), model.params().numel() - 2 * c.heads);
  }
}

// The sink changes the loss: off-by-one's zero logit and learnable's logits are in every row.
TEST(SoftmaxType, EachTypeGivesItsOwnLoss) {
  OpTable ops = reference_ops();
  std::vector<double> losses;
  for (SoftmaxType t : {SoftmaxType::kVanilla, SoftmaxType::kOffByOne, SoftmaxType::kLearnable}) {
    const ModelConfig c = sink_config(t);
    GPTModel model(c, single_process_partition(c), &ops);
    model.params().initialize(42);
    if (t == SoftmaxType::kLearnable)  // logits of 0 give off-by-one's loss exactly
      for (int layer = 0; layer < 2; ++layer) {
        const int id = model.params().find("decoder.layers." + std::to_string(layer) +
                                           ".self_attention.core_attention.softmax_offset");
        for (int64_t h = 0; h < c.heads; ++h) model.params().param_data(id)[h] = 0.0f;
      }
    MicroBatch mb = testing::masked_batch(c, 2, 7, false);
    losses.push_back(testing::mean_loss(model, mb, false));
  }
  EXPECT_GT(std::fabs(losses[1] - losses[0]), 1e-4);
  EXPECT_NEAR(losses[2], losses[1], 1e-6);
}

TEST(SoftmaxType, EveryParameterMatchesFiniteDifferences) {
  for (SoftmaxType t : {SoftmaxType::kVanilla, SoftmaxType::kOffByOne, SoftmaxType::kLearnable}) {
    SCOPED_TRACE(static_cast<int>(t));
    testing::expect_every_parameter_matches_finite_differences(sink_config(t));
  }
}

// The sink logits' gradient at logits far from 0 (a sink that takes most of a row, one that takes
// little), each head on its own.
TEST(SoftmaxType, LearnableLogitsGradientAwayFromZero) {
  const ModelConfig c = sink_config(SoftmaxType::kLearnable);
  OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  model.params().initialize(42);
  ParamBuffer& pb = model.params();
  const int id = pb.find(kOffset);
  const float logits[4] = {2.5f, -1.5f, 0.75f, 4.0f};
  std::copy_n(logits, 4, pb.param_data(id));
  MicroBatch mb = testing::masked_batch(c, 2, 11, false);
  testing::mean_loss(model, mb, true);
  const std::vector<float> grad(pb.grad_data(id), pb.grad_data(id) + c.heads);
  auto loss = [&] { return testing::mean_loss(model, mb, false); };
  for (int64_t h = 0; h < c.heads; ++h) {
    std::vector<float> e(static_cast<size_t>(c.heads), 0.0f);
    e[h] = 1.0f;
    const double numeric = testing::directional_derivative_5point(loss, pb.param_data(id), e.data(), c.heads, 5e-3);
    EXPECT_NEAR(grad[h], numeric, 1e-2 * std::max(1e-2, std::fabs(numeric))) << "head " << h;
  }
}

TEST(SoftmaxType, KvCacheDecodingEqualsTheWholeSequenceForward) {
  for (SoftmaxType t : {SoftmaxType::kOffByOne, SoftmaxType::kLearnable}) {
    SCOPED_TRACE(static_cast<int>(t));
    testing::expect_reference_model_decoding_equals_whole_forward(sink_config(t));
  }
}

// --flash-decode: one-token steps merge the chunks with the sink once (learnable logits, GQA).
TEST(SoftmaxType, FlashDecodeStepsEqualTheWholeSequenceForward) {
  ModelConfig c = testing::tiny_llama_config();
  c.softmax_type = SoftmaxType::kLearnable;
  OpTable ops = reference_ops();
  const ModelPartition part = single_process_partition(c);
  GPTModel model(c, part, &ops);
  model.params().initialize(5);
  const int64_t S = 19;
  KvCache cache = make_kv_cache(c, part, 1, S);
  cache.flash_decode_chunk = 3;
  testing::expect_chunked_decoding_equals_whole_forward(model, cache, model, testing::test_tokens(S, c.vocab), 1, S,
                                                        {6, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, 2e-5);
}

// Hybrid Mamba models: the attention layers ('*') hold the sink logits under Megatron's names (the
// Mamba and MLP layers none), "M*-M" on the finite-difference sizes.
TEST(SoftmaxType, HybridAttentionLayersMatchFiniteDifferences) {
  ModelConfig c = testing::gradcheck_gpt_config();
  c.num_layers = 4;
  c.rms_norm = true;
  c.position = PositionEmbedding::kNone;
  c.hybrid.enabled = true;
  c.hybrid.layers = "M*-M";
  c.hybrid.headdim = 8;
  c.hybrid.ngroups = 2;
  c.hybrid.d_state = 4;
  c.softmax_type = SoftmaxType::kLearnable;
  OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  for (int64_t l = 0; l < c.num_layers; ++l)
    EXPECT_EQ(model.params().find("decoder.layers." + std::to_string(l) + ".self_attention.core_attention.softmax_offset") >= 0,
              l == 1)
        << l;
  testing::expect_every_parameter_matches_finite_differences(c);
}

// The tiny hybrid model M * - M * M with learnable sinks: cached greedy decoding (Mamba states and
// the attention layers' keys and values) equals the full forward at every step.
TEST(SoftmaxType, HybridCachedDecodingEqualsTheFullForward) {
  ModelConfig c = testing::tiny_hybrid_config();
  c.softmax_type = SoftmaxType::kLearnable;
  const OpTable ops = testing::decoding_ops();
  std::unique_ptr<GPTModel> model = testing::decoding_model(c, &ops, 7);
  testing::make_mamba_state_carry(*model);
  testing::expect_greedy_decoding_of_prompts(*model, {1, 7, 19}, {{5, 9, 11, 2, 40, 7}, {33, 1, 8, 8, 60, 21}});
}

// Multi-latent attention (Megatron's MLA spec has the same core attention): the sink logits under
// Megatron's name, finite differences (off-by-one and learnable; a query latent or none, V padded),
// and decoding against the whole forward.
TEST(SoftmaxType, MultiLatentAttentionMatchesFiniteDifferencesAndDecodes) {
  for (SoftmaxType t : {SoftmaxType::kOffByOne, SoftmaxType::kLearnable})
    for (int64_t q_lora_rank : {int64_t{0}, int64_t{6}}) {
      SCOPED_TRACE(std::to_string(static_cast<int>(t)) + " q_lora_rank " + std::to_string(q_lora_rank));
      ModelConfig c = testing::mla_config(/*llama=*/true, q_lora_rank, /*qk_layernorm=*/true, /*v_head_dim=*/3);
      c.softmax_type = t;
      OpTable ops = reference_ops();
      GPTModel model(c, single_process_partition(c), &ops);
      const int id = model.params().find(kOffset);
      EXPECT_EQ(id >= 0, t == SoftmaxType::kLearnable);
      if (id >= 0) EXPECT_EQ(model.params().spec(id).global_shape, (Shape{c.heads}));
      testing::expect_every_parameter_matches_finite_differences(c);
      testing::expect_reference_model_decoding_equals_whole_forward(c);
    }
}

// Gated DeltaNet models (--experimental-attention-variant gdn): the GDN layers have no softmax, the
// attention layers hold the sink logits; finite differences (G * on the finite-difference sizes) and
// cached greedy decoding of the tiny G * G G * model (GDN states and keys/values) against the full forward.
TEST(SoftmaxType, GatedDeltaNetModelsAttentionLayers) {
  ModelConfig c = testing::gradcheck_gpt_config();
  use_llama_architecture(c);
  c.gdn.enabled = true;
  c.gdn.pattern = {1, 0};
  c.gdn.num_key_heads = 2;
  c.gdn.num_value_heads = 4;
  c.gdn.key_head_dim = 4;
  c.gdn.value_head_dim = 6;
  c.gdn.conv_kernel = 3;
  c.softmax_type = SoftmaxType::kLearnable;
  {
    OpTable ops = reference_ops();
    GPTModel model(c, single_process_partition(c), &ops);
    EXPECT_LT(model.params().find("decoder.layers.0.self_attention.core_attention.softmax_offset"), 0);
    EXPECT_GE(model.params().find(kOffset), 0);
  }
  testing::expect_every_parameter_matches_finite_differences(c, 1e-3, 2e-2);  // as the GDN model tests
  ModelConfig d = testing::tiny_gdn_config();
  d.softmax_type = SoftmaxType::kLearnable;
  const OpTable ops = testing::decoding_ops();
  std::unique_ptr<GPTModel> model = testing::decoding_model(d, &ops, 7);
  testing::make_gdn_state_carry(*model);
  testing::expect_greedy_decoding_of_prompts(*model, {1, 7, 19}, {{5, 9, 11, 2, 40, 7}, {33, 1, 8, 8, 60, 21}});
}

}  // namespace
}  // namespace gale
