// Heterogeneous layers with MoE (--num-experts): as Megatron's MoE block spec with the
// heterogeneous config, every layer's attention has its own query groups and a dense layer its own
// FFN size, while the MoE layers keep the experts' FFN; finite differences of every parameter.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/gpt_model.h"
#include "model_test_batches.h"
#include "testing.h"
#include "train/heterogeneous_config.h"

namespace gale {
namespace {

// Three layers on a 16-wide GPT with 4 heads in 2 query groups by default: 0 one group, dense FFN 20;
// 1 four groups, MoE; 2 the flags' groups, MoE. Four experts of FFN 8, all routed (top-4: the
// gradient check does not cross a routing switch, as tests/model/hybrid_model_test.cc), with the
// load-balancing loss.
ModelConfig hetero_moe_config() {
  ModelConfig c = testing::gradcheck_gpt_config();
  c.num_layers = 3;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 4;
  c.moe.num_experts = 4;
  c.moe.topk = 4;
  c.moe.ffn = 8;
  c.moe.aux_loss_coeff = 0.01;
  c.moe.pattern = {0, 1, 1};
  const std::string json = R"({"block_configs": [
    {"attention": {"n_heads_in_group": 4}, "ffn": {"ffn_hidden_size": 20}},
    {"attention": {"num_query_groups": 4}, "ffn": {}},
    {"attention": {}, "ffn": {}}]})";
  StatusOr<std::vector<HeteroLayer>> layers =
      parse_heterogeneous_layers(json, HeteroModelShape{3, c.hidden, c.heads, c.kv_heads, c.ffn}, "test");
  GALE_CHECK(layers.ok()) << layers.status().message();
  c.hetero = layers.value();
  return c;
}

TEST(HeterogeneousMoe, LayersKeepTheirGroupsAndTheDenseLayerItsFfn) {
  const ModelConfig c = hetero_moe_config();
  const OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  const ParamBuffer& pb = model.params();
  const auto shape = [&](const std::string& name) {
    const int id = pb.find(name);
    EXPECT_GE(id, 0) << name;
    return id >= 0 ? pb.spec(id).global_shape : Shape{};
  };
  EXPECT_EQ(shape("decoder.layers.0.self_attention.linear_qkv.weight"), (Shape{(4 + 2 * 1) * 4, 16}));
  EXPECT_EQ(shape("decoder.layers.0.mlp.linear_fc1.weight"), (Shape{20, 16}));
  EXPECT_EQ(shape("decoder.layers.1.self_attention.linear_qkv.weight"), (Shape{(4 + 2 * 4) * 4, 16}));
  EXPECT_EQ(shape("decoder.layers.2.self_attention.linear_qkv.weight"), (Shape{(4 + 2 * 2) * 4, 16}));
  EXPECT_EQ(pb.find("decoder.layers.1.mlp.linear_fc1.weight"), -1);
  EXPECT_GE(pb.find("decoder.layers.1.mlp.router.weight"), 0);
}

TEST(HeterogeneousMoe, EveryParameterMatchesFiniteDifferences) {
  testing::expect_every_parameter_matches_finite_differences(hetero_moe_config());
}

}  // namespace
}  // namespace gale
