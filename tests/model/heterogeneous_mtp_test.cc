// Heterogeneous layers with multi-token prediction (--mtp-num-layers): as Megatron main's
// gpt_builder, the MTP transformer layers are the usual decoder layer with the flags' query groups
// and FFN size (block_configs only cover the decoder's layers); finite differences of every
// parameter of the loss main + factor/D·Σ L_k through a decoder with every sub-block kind.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/gpt_model.h"
#include "model_test_batches.h"
#include "mtp_gradcheck.h"
#include "testing.h"
#include "train/heterogeneous_config.h"

namespace gale {
namespace {

using testing::expect_mtp_gradients_match;

// Four layers on a 16-wide GPT with 4 heads in 2 query groups by default: 0 one group, FFN 20;
// 1 no-op attention, linear MLP; 2 linear attention, FFN 8; 3 four groups, no-op MLP; then `mtp`
// MTP layers.
ModelConfig hetero_mtp_config(int64_t mtp) {
  ModelConfig c = testing::gradcheck_gpt_config();
  c.num_layers = 4;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 4;
  c.mtp_num_layers = mtp;
  c.mtp_loss_scaling_factor = 0.3;
  const std::string json = R"({"block_configs": [
    {"attention": {"n_heads_in_group": 4}, "ffn": {"ffn_hidden_size": 20}},
    {"attention": {"no_op": true}, "ffn": {"replace_with_linear": true}},
    {"attention": {"replace_with_linear": true}, "ffn": {"ffn_hidden_size": 8}},
    {"attention": {"num_query_groups": 4}, "ffn": {"no_op": true}}]})";
  StatusOr<std::vector<HeteroLayer>> layers =
      parse_heterogeneous_layers(json, HeteroModelShape{4, c.hidden, c.heads, c.kv_heads, c.ffn}, "test");
  GALE_CHECK(layers.ok()) << layers.status().message();
  c.hetero = layers.value();
  return c;
}


// The MTP layers hold the model-wide attention (2 groups) and MLP (the flags' FFN), not the last
// decoder layer's (4 groups, no MLP).
TEST(HeterogeneousMtp, MtpLayersAreTheFlagsLayer) {
  const ModelConfig c = hetero_mtp_config(2);
  const OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  const ParamBuffer& pb = model.params();
  const auto shape = [&](const std::string& name) {
    const int id = pb.find(name);
    EXPECT_GE(id, 0) << name;
    return id >= 0 ? pb.spec(id).global_shape : Shape{};
  };
  for (int k = 0; k < 2; ++k) {
    const std::string layer = "mtp.layers." + std::to_string(k) + ".transformer_layer.";
    EXPECT_EQ(shape(layer + "self_attention.linear_qkv.weight"), (Shape{(4 + 2 * 2) * 4, 16}));
    EXPECT_EQ(shape(layer + "mlp.linear_fc1.weight"), (Shape{c.fc1_out(), 16}));
    EXPECT_EQ(shape(layer + "mlp.linear_fc2.weight"), (Shape{16, c.ffn}));
    EXPECT_EQ(pb.find(layer + "self_attention.weight"), -1);
  }
  EXPECT_EQ(shape("decoder.layers.3.self_attention.linear_qkv.weight"), (Shape{(4 + 2 * 4) * 4, 16}));
  EXPECT_EQ(pb.find("decoder.layers.3.mlp.linear_fc1.weight"), -1);
}

// Five-point directional derivatives in fp32 with h = 5e-3 (1% relative with a 1e-2 floor, as
// tests/model/mtp_test.cc), every parameter, over a batch with masked tokens.
TEST(HeterogeneousMtp, EveryParameterMatchesFiniteDifferences) {
  const ModelConfig c = hetero_mtp_config(2);
  const OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  model.params().initialize(42);
  const MicroBatch mb = testing::masked_batch(c, 2, 7, /*documents=*/false);
  std::vector<double> mtp;
  const std::vector<std::string> names = expect_mtp_gradients_match(model, mb, 5e-3, &mtp);
  ASSERT_EQ(mtp.size(), 2u);
  EXPECT_GT(mtp[0], 0.0);
  EXPECT_GT(mtp[1], 0.0);
  EXPECT_GT(testing::count_names(names, "mtp.layers."), 10);
}

}  // namespace
}  // namespace gale
