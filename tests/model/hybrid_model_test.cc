// The hybrid Mamba model (--is-hybrid-model) as a whole: finite-difference gradients of every
// parameter through Mamba ('M'), attention-only ('*'), MLP-only ('-') and MoE ('E') layers, and
// Megatron's names.
#include <gtest/gtest.h>

#include "model/gpt_model.h"
#include "model/hybrid_layers.h"
#include "model_test_batches.h"
#include "testing.h"

namespace gale {
namespace {

// Four layers "M*-M" on the 2-layer test GPT's sizes: hidden 16 (d_inner 32: 4 heads of 8, 2
// groups, d_state 4), RMSNorm, no position embedding (as Megatron's Mamba examples).
ModelConfig hybrid_config() {
  ModelConfig c = testing::gradcheck_gpt_config();
  c.num_layers = 4;
  c.rms_norm = true;
  c.position = PositionEmbedding::kNone;
  c.hybrid.enabled = true;
  c.hybrid.layers = "M*-M";
  c.hybrid.headdim = 8;
  c.hybrid.ngroups = 2;
  c.hybrid.d_state = 4;
  return c;
}

// "M*E-M" with a MoE layer ('E'): 4 experts of FFN 8, every token to all 4 (top-4 of 4: the
// routing weights are a smooth softmax, so finite differences see no top-k switch; the top-k
// selection itself: tests/model/moe_router_test.cc), and a shared expert of FFN 8 (no linear biases:
// the shared expert has none).
ModelConfig hybrid_moe_config() {
  ModelConfig c = hybrid_config();
  c.add_bias_linear = false;
  c.num_layers = 5;
  c.hybrid.layers = "M*E-M";
  c.moe.num_experts = 4;
  c.moe.topk = 4;
  c.moe.ffn = 8;
  c.moe.shared_ffn = 8;
  c.moe.pattern = hybrid_moe_layer_flags(c.hybrid.layers);
  return c;
}

// "MG-*G" with Gated DeltaNet layers ('G', Megatron-Core main's gdn_layer): the GDN mixer in
// self-attention's place and no MLP; 2 key heads of 4, 4 value heads of 6, convolution width 3.
ModelConfig hybrid_gdn_config() {
  ModelConfig c = hybrid_config();
  c.num_layers = 5;
  c.hybrid.layers = "MG-*G";
  c.gdn.enabled = true;
  c.gdn.pattern = hybrid_gdn_layer_flags(c.hybrid.layers);
  c.gdn.num_key_heads = 2;
  c.gdn.num_value_heads = 4;
  c.gdn.key_head_dim = 4;
  c.gdn.value_head_dim = 6;
  c.gdn.conv_kernel = 3;
  return c;
}


TEST(HybridModel, EveryParameterMatchesFiniteDifferences) {
  testing::expect_every_parameter_matches_finite_differences(hybrid_config());
}

TEST(HybridModel, EveryParameterOfAMoeLayerMatchesFiniteDifferences) {
  testing::expect_every_parameter_matches_finite_differences(hybrid_moe_config());
}

// h = 1e-3 with a 2e-2 floor: the GDN layers' loss is curved enough (q and k L2-normalised over 4
// channels) that at h = 5e-3 or 1e-2 the five-point estimate itself moves by tens of percent (its
// truncation error: the analytic gradient stays put while the estimates converge to it as h
// shrinks); at 1e-3 fp32 rounding leaves ~2e-4 absolute on the smallest gradients (A_log, dt_bias).
TEST(HybridModel, EveryParameterOfGatedDeltaNetLayersMatchesFiniteDifferences) {
  testing::expect_every_parameter_matches_finite_differences(hybrid_gdn_config(), 1e-3, 2e-2);
}

// Megatron-Core main's gdn_layer names in the hybrid stack: the GDN mixer as self_attention (its norm
// fused into in_proj), no MLP in a 'G' layer.
TEST(HybridModel, GatedDeltaNetLayersHaveMegatronNames) {
  const ModelConfig c = hybrid_gdn_config();
  OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  const ParamBuffer& pb = model.params();
  for (const char* name :
       {"decoder.layers.1.self_attention.in_proj.layer_norm_weight", "decoder.layers.1.self_attention.in_proj.weight",
        "decoder.layers.1.self_attention.conv1d.weight", "decoder.layers.1.self_attention.A_log",
        "decoder.layers.1.self_attention.dt_bias", "decoder.layers.1.self_attention.out_norm.weight",
        "decoder.layers.1.self_attention.out_proj.weight", "decoder.layers.4.self_attention.out_proj.weight",
        "decoder.layers.3.self_attention.linear_qkv.weight", "decoder.layers.2.mlp.linear_fc1.weight",
        "decoder.layers.0.mixer.A_log"})
    EXPECT_GE(pb.find(name), 0) << name;
  for (const char* name : {"decoder.layers.1.mlp.linear_fc1.weight", "decoder.layers.1.mlp.linear_fc1.layer_norm_weight",
                           "decoder.layers.1.self_attention.linear_qkv.weight", "decoder.layers.1.mixer.A_log",
                           "decoder.layers.4.mlp.linear_fc2.weight", "decoder.layers.3.self_attention.in_proj.weight"})
    EXPECT_LT(pb.find(name), 0) << name;
}

// Megatron's Mamba stack names: the mixer's tensors in 'M' layers, the norms fused into the next
// linear (layer_norm_weight) in '*' and '-' layers, which hold only their half, decoder.final_norm.
TEST(HybridModel, MegatronParameterNames) {
  const ModelConfig c = hybrid_config();
  OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  const ParamBuffer& pb = model.params();
  for (const char* name :
       {"decoder.layers.0.mixer.in_proj.layer_norm_weight", "decoder.layers.0.mixer.A_log",
        "decoder.layers.1.self_attention.linear_qkv.layer_norm_weight", "decoder.layers.1.self_attention.linear_qkv.weight",
        "decoder.layers.1.self_attention.linear_proj.weight", "decoder.layers.2.mlp.linear_fc1.layer_norm_weight",
        "decoder.layers.2.mlp.linear_fc1.weight", "decoder.layers.2.mlp.linear_fc2.weight",
        "decoder.layers.3.mixer.out_proj.weight", "decoder.final_norm.weight"})
    EXPECT_GE(pb.find(name), 0) << name;
  for (const char* name : {"decoder.layers.1.mlp.linear_fc1.weight", "decoder.layers.1.pre_mlp_layernorm.weight",
                           "decoder.layers.2.self_attention.linear_qkv.weight", "decoder.layers.0.input_layernorm.weight",
                           "decoder.final_layernorm.weight"})
    EXPECT_LT(pb.find(name), 0) << name;
}

// Megatron-Core's moe_layer spec for 'E' (MoETransformerLayer: pre_mlp_layernorm = TENorm, mlp =
// MoELayer): the norm unfused as decoder.layers.N.pre_mlp_layernorm, the router, the experts
// (SequentialMLP's local_experts names, the form Megatron's distributed checkpoints share with its
// grouped experts) and the shared expert; no attention, no dense MLP.
TEST(HybridModel, MoeLayerHasMegatronNames) {
  const ModelConfig c = hybrid_moe_config();
  OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  const ParamBuffer& pb = model.params();
  for (const char* name :
       {"decoder.layers.2.pre_mlp_layernorm.weight", "decoder.layers.2.mlp.router.weight",
        "decoder.layers.2.mlp.experts.local_experts.0.linear_fc1.weight",
        "decoder.layers.2.mlp.experts.local_experts.3.linear_fc2.weight",
        "decoder.layers.2.mlp.shared_experts.linear_fc1.weight", "decoder.layers.2.mlp.shared_experts.linear_fc2.weight",
        "decoder.layers.3.mlp.linear_fc1.layer_norm_weight", "decoder.layers.3.mlp.linear_fc1.weight"})
    EXPECT_GE(pb.find(name), 0) << name;
  for (const char* name :
       {"decoder.layers.2.mlp.linear_fc1.layer_norm_weight", "decoder.layers.2.mlp.linear_fc1.weight",
        "decoder.layers.2.self_attention.linear_qkv.weight", "decoder.layers.2.input_layernorm.weight",
        "decoder.layers.2.self_attention.linear_qkv.layer_norm_weight", "decoder.layers.3.mlp.router.weight",
        "decoder.layers.1.mlp.router.weight", "decoder.layers.0.mlp.router.weight"})
    EXPECT_LT(pb.find(name), 0) << name;
  EXPECT_EQ(c.num_moe_layers(), 1);
}

}  // namespace
}  // namespace gale
