// Heterogeneous layers with --experimental-attention-variant gdn: as Megatron main's gpt_builder
// (the experimental-attention block spec, its TransformerBlock applying each layer's config), the
// full-attention layers have their own query groups, the Gated DeltaNet layers the --linear-* sizes,
// and every layer its own FFN size; the shapes, and finite differences of every parameter.
#include <gtest/gtest.h>

#include <string>

#include "model/gpt_model.h"
#include "model_test_batches.h"
#include "testing.h"
#include "train/heterogeneous_config.h"

namespace gale {
namespace {

// Three layers G * G on a 16-wide GPT (RMSNorm, SwiGLU) with 4 heads in 2 query groups by default:
// 0 (GDN) FFN 20 (its n_heads_in_group unused, as Megatron's GDN mixer ignores the layer's
// groups); 1 (attention) four groups, FFN 8; 2 (GDN) the flags' FFN. GDN: 2 key heads of 4, 4
// value heads of 6, convolution width 3.
ModelConfig hetero_gdn_config() {
  ModelConfig c = testing::gradcheck_gpt_config();
  c.num_layers = 3;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 4;
  c.rms_norm = true;
  c.swiglu = true;
  c.add_bias_linear = false;
  c.gdn.enabled = true;
  c.gdn.pattern = {1, 0, 1};
  c.gdn.num_key_heads = 2;
  c.gdn.num_value_heads = 4;
  c.gdn.key_head_dim = 4;
  c.gdn.value_head_dim = 6;
  c.gdn.conv_kernel = 3;
  const std::string json = R"({"block_configs": [
    {"attention": {"n_heads_in_group": 4}, "ffn": {"ffn_hidden_size": 20}},
    {"attention": {"num_query_groups": 4}, "ffn": {"ffn_hidden_size": 8}},
    {"attention": {}, "ffn": {}}]})";
  StatusOr<std::vector<HeteroLayer>> layers =
      parse_heterogeneous_layers(json, HeteroModelShape{3, c.hidden, c.heads, c.kv_heads, c.ffn}, "test");
  GALE_CHECK(layers.ok()) << layers.status().message();
  c.hetero = layers.value();
  return c;
}

TEST(HeterogeneousGdn, AttentionLayersKeepTheirGroupsAndEveryLayerItsFfn) {
  const ModelConfig c = hetero_gdn_config();
  const OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  const ParamBuffer& pb = model.params();
  const auto shape = [&](const std::string& name) {
    const int id = pb.find(name);
    EXPECT_GE(id, 0) << name;
    return id >= 0 ? pb.spec(id).global_shape : Shape{};
  };
  EXPECT_EQ(shape("decoder.layers.1.self_attention.linear_qkv.weight"), (Shape{(4 + 2 * 4) * 4, 16}));
  EXPECT_EQ(shape("decoder.layers.0.mlp.linear_fc1.weight"), (Shape{2 * 20, 16}));  // SwiGLU: gate and up
  EXPECT_EQ(shape("decoder.layers.1.mlp.linear_fc1.weight"), (Shape{2 * 8, 16}));
  EXPECT_EQ(shape("decoder.layers.2.mlp.linear_fc1.weight"), (Shape{2 * c.ffn, 16}));
  EXPECT_EQ(shape("decoder.layers.0.self_attention.out_proj.weight"), shape("decoder.layers.2.self_attention.out_proj.weight"));
  EXPECT_EQ(pb.find("decoder.layers.0.self_attention.linear_qkv.weight"), -1);
  EXPECT_GE(pb.find("decoder.layers.2.self_attention.A_log"), 0);
}

TEST(HeterogeneousGdn, EveryParameterMatchesFiniteDifferences) {
  testing::expect_every_parameter_matches_finite_differences(hetero_gdn_config());
}

}  // namespace
}  // namespace gale
