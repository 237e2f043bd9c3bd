// The other layer kinds of a hybrid model's multi-token-prediction depths (Megatron main's MTP
// pattern takes every hybrid symbol): Gated DeltaNet ('G'), multi-latent attention ('+') and MoE
// ('E') layers after '/' (model/gpt_model.h); finite-difference gradients of every parameter of
// main + factor/D·Σ L_k, and Megatron's names (mtp.layers.{k}.mtp_model_layer.layers.{j}.).
#include <gtest/gtest.h>

#include <string>

#include "mla_test_config.h"
#include "model/gpt_model.h"
#include "model/hybrid_layers.h"
#include "model_test_batches.h"
#include "mtp_gradcheck.h"
#include "testing.h"

namespace gale {
namespace {

// Hidden 16 (d_inner 32 in 4 heads of 8, 2 groups, d_state 4), RMSNorm, decoder `layers`, 2 depths
// of `mtp`.
ModelConfig with_hybrid(ModelConfig c, const std::string& layers, const std::string& mtp) {
  c.num_layers = static_cast<int64_t>(layers.size());
  c.rms_norm = true;
  c.hybrid.enabled = true;
  c.hybrid.layers = layers;
  c.hybrid.mtp = mtp;
  c.hybrid.headdim = 8;
  c.hybrid.ngroups = 2;
  c.hybrid.d_state = 4;
  c.mtp_num_layers = 2;
  c.mtp_loss_scaling_factor = 0.3;
  return c;
}

std::string all_layers(const ModelConfig& c) { return c.hybrid.layers + c.hybrid.mtp + c.hybrid.mtp; }

// 'G' only in the MTP depths: 2 key heads of 4, 4 value heads of 6, convolution width 3.
ModelConfig gdn_mtp_config() {
  ModelConfig c = with_hybrid(testing::gradcheck_gpt_config(), "M*-M", "GM");
  c.position = PositionEmbedding::kNone;
  c.gdn.enabled = true;
  c.gdn.pattern = hybrid_gdn_layer_flags(all_layers(c));
  c.gdn.num_key_heads = 2;
  c.gdn.num_value_heads = 4;
  c.gdn.key_head_dim = 4;
  c.gdn.value_head_dim = 6;
  c.gdn.conv_kernel = 3;
  return c;
}

// '+' in the decoder and the MTP depths (Dn 4, R 4, Dv 3, KV latent 5, no query latent), RoPE.
ModelConfig mla_mtp_config() {
  ModelConfig c = with_hybrid(testing::mla_config(/*llama=*/false, 0, /*qk_layernorm=*/false, /*v_head_dim=*/3),
                              "M+-M", "+M");
  c.position = PositionEmbedding::kRope;
  return c;
}

// 'E' only in the MTP depths: 4 experts of FFN 8, top-4 (smooth routing for finite differences),
// a shared expert of FFN 8, no linear biases.
ModelConfig moe_mtp_config() {
  ModelConfig c = with_hybrid(testing::gradcheck_gpt_config(), "M*-M", "E*");
  c.position = PositionEmbedding::kNone;
  c.add_bias_linear = false;
  c.moe.num_experts = 4;
  c.moe.topk = 4;
  c.moe.ffn = 8;
  c.moe.shared_ffn = 8;
  c.moe.pattern = hybrid_moe_layer_flags(all_layers(c));
  return c;
}

// `fragment` of the parameters of MTP depth `k`'s layer 0 (its 'G', '+' or 'E' layer).
void expect_gradients_and_names(const ModelConfig& c, const std::string& fragment) {
  const OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  model.params().initialize(42);
  const MicroBatch mb = testing::masked_batch(c, 2, 7, /*documents=*/false);
  std::vector<double> mtp;
  const std::vector<std::string> names = testing::expect_mtp_gradients_match(model, mb, 5e-3, &mtp);
  ASSERT_EQ(mtp.size(), 2u);
  EXPECT_GT(mtp[0], 0.0);
  EXPECT_GT(mtp[1], 0.0);
  for (int k = 0; k < 2; ++k) {
    const std::string layer = "mtp.layers." + std::to_string(k) + ".mtp_model_layer.layers.0.";
    EXPECT_GT(testing::count_names(names, layer, fragment), 0) << layer << "*" << fragment;
  }
}

TEST(HybridMtpLayers, GatedDeltaNetDepthsMatchFiniteDifferences) {
  const ModelConfig c = gdn_mtp_config();
  expect_gradients_and_names(c, ".self_attention.in_proj.");
  // The GDN layer has no MLP (Megatron's gdn_layer), the decoder none of GDN's parameters.
  const OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  for (const ParamSpec& s : model.params().specs()) {
    if (s.name.find("mtp_model_layer.layers.0.") != std::string::npos)
      EXPECT_EQ(s.name.find(".mlp."), std::string::npos) << s.name;
    if (s.name.rfind("decoder.", 0) == 0)  // no GDN layer in the decoder
      EXPECT_EQ(s.name.find("self_attention.A_log"), std::string::npos) << s.name;
  }
}

TEST(HybridMtpLayers, MultiLatentAttentionDepthsMatchFiniteDifferences) {
  expect_gradients_and_names(mla_mtp_config(), ".self_attention.linear_kv_down_proj.");
}

TEST(HybridMtpLayers, MoeDepthsMatchFiniteDifferences) {
  const ModelConfig c = moe_mtp_config();
  expect_gradients_and_names(c, ".mlp.router.");
  const OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  const ParamBuffer& pb = model.params();
  for (const char* name : {"mtp.layers.1.mtp_model_layer.layers.0.mlp.router.weight",
                           "mtp.layers.0.mtp_model_layer.layers.0.mlp.shared_experts.linear_fc1.weight"})
    EXPECT_GE(pb.find(name), 0) << name;
  for (const ParamSpec& s : pb.specs()) {
    EXPECT_EQ(s.name.rfind("decoder.", 0) == 0 && s.name.find(".router.") != std::string::npos, false) << s.name;
    if (s.name.find("mtp_model_layer.layers.0.") != std::string::npos)
      EXPECT_EQ(s.name.find("self_attention"), std::string::npos) << s.name;  // an MoE-only layer
  }
  EXPECT_EQ(c.num_moe_layers(), 2);  // the aux losses' mean counts the MTP depths' MoE layers
}

}  // namespace
}  // namespace gale
