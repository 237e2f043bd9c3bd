// Multi-latent attention layers ('+') in a hybrid Mamba model (Megatron main's hybrid mla_layer:
// input_layernorm, then MLASelfAttention without q/kv layernorms, no MLP): finite-difference
// gradients of every parameter through Mamba, MLA and MLP layers (with and without a query latent),
// Megatron's names, and the MLA layer equal to a GPT MLA model's attention half.
#include <gtest/gtest.h>

#include <cstring>

#include "mla_test_config.h"
#include "model/gpt_model.h"
#include "model_test_batches.h"
#include "testing.h"

namespace gale {
namespace {

// "M+-M" on the MLA test model's sizes (hidden 16: d_inner 32 in 4 heads of 8, 2 groups, d_state
// 4), RMSNorm; MLA Dn 4, R 4, Dv 3, KV latent 5, a query latent of `q_lora_rank` (0: none).
ModelConfig hybrid_mla_config(int64_t q_lora_rank) {
  ModelConfig c = testing::mla_config(/*llama=*/false, q_lora_rank, /*qk_layernorm=*/false, /*v_head_dim=*/3);
  c.num_layers = 4;
  c.rms_norm = true;
  c.position = PositionEmbedding::kRope;
  c.hybrid.enabled = true;
  c.hybrid.layers = "M+-M";
  c.hybrid.headdim = 8;
  c.hybrid.ngroups = 2;
  c.hybrid.d_state = 4;
  return c;
}

class HybridMlaGrad : public ::testing::TestWithParam<int64_t> {};

TEST_P(HybridMlaGrad, EveryParameterMatchesFiniteDifferences) {
  testing::expect_every_parameter_matches_finite_differences(hybrid_mla_config(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(QueryLatent, HybridMlaGrad, ::testing::Values(0, 6),
                         [](const auto& info) { return info.param ? std::string("q_lora") : std::string("no_q_lora"); });

TEST(HybridMla, MegatronParameterNames) {
  const ModelConfig c = hybrid_mla_config(6);
  const OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  const ParamBuffer& pb = model.params();
  for (const char* name : {"decoder.layers.1.input_layernorm.weight", "decoder.layers.1.self_attention.linear_q_down_proj.weight",
                           "decoder.layers.1.self_attention.linear_q_up_proj.weight",
                           "decoder.layers.1.self_attention.linear_kv_down_proj.weight",
                           "decoder.layers.1.self_attention.linear_kv_up_proj.weight",
                           "decoder.layers.1.self_attention.linear_proj.weight", "decoder.layers.0.mixer.in_proj.weight",
                           "decoder.layers.2.mlp.linear_fc1.layer_norm_weight"})
    EXPECT_GE(pb.find(name), 0) << name;
  for (const ParamSpec& s : pb.specs()) {
    if (s.name.rfind("decoder.layers.1.", 0) != 0) continue;
    EXPECT_EQ(s.name.find("layer_norm_weight"), std::string::npos) << s.name;  // no q/kv norms, no fused norm
    EXPECT_EQ(s.name.find(".mlp."), std::string::npos) << s.name;
  }
}

// The '+' layer is the attention half of a GPT MLA layer: a one-layer hybrid model "+" and a
// one-layer MLA GPT model with no MLP (FFN 0 is not a model, so its MLP output is zeroed by zero
// fc2 weights and biases) give the same logits with the same attention weights.
TEST(HybridMla, TheMlaLayerIsAGptMlaLayersAttentionHalf) {
  ModelConfig h = hybrid_mla_config(0);
  h.num_layers = 1;
  h.hybrid.layers = "+";
  h.add_bias_linear = false;
  ModelConfig g = h;
  g.hybrid = HybridConfig{};
  const OpTable ops = reference_ops();
  GPTModel hm(h, single_process_partition(h), &ops), gm(g, single_process_partition(g), &ops);
  hm.params().initialize(3);
  gm.params().initialize(3);
  ParamBuffer &hp = hm.params(), &gp = gm.params();
  for (int id = 0; id < gp.size(); ++id) {
    const std::string& name = gp.spec(id).name;
    std::vector<float> v(static_cast<size_t>(gp.spec(id).local_numel()), 0.0f);
    const int src = hp.find(name == "decoder.final_layernorm.weight" ? "decoder.final_norm.weight" : name);
    if (src >= 0) {
      std::memcpy(v.data(), hp.param_data(src), v.size() * sizeof(float));
    } else {
      ASSERT_NE(name.find("mlp"), std::string::npos) << name;  // only the MLP is the GPT layer's own
      if (name.find("layernorm") != std::string::npos) std::fill(v.begin(), v.end(), 1.0f);
    }
    gp.set_param_values(id, v.data());
  }
  const MicroBatch mb = testing::masked_batch(h, 2, 5, false);
  const Tensor a = hm.forward_logits(mb, Tensor()), b = gm.forward_logits(mb, Tensor());
  ASSERT_EQ(a.numel(), b.numel());
  double worst = 0.0, scale = 0.0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    worst = std::max(worst, std::abs(double(a.data<float>()[i]) - b.data<float>()[i]));
    scale = std::max(scale, std::abs(double(b.data<float>()[i])));
  }
  EXPECT_GT(scale, 0.1);
  EXPECT_LT(worst, 1e-6 * scale);
}

}  // namespace
}  // namespace gale
