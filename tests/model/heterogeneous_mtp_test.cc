// Heterogeneous layers with multi-token prediction (--mtp-num-layers): as Megatron main's
// gpt_builder, the MTP transformer layers are the usual decoder layer with the flags' query groups
// and FFN size (block_configs only cover the decoder's layers); finite differences of every
// parameter of the loss main + factor/D·Σ L_k through a decoder with every sub-block kind.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/gpt_model.h"
#include "model_test_batches.h"
#include "testing.h"
#include "train/heterogeneous_config.h"

namespace gale {
namespace {

using testing::directional_derivative_5point;
using testing::dot;
using testing::random_vector;
using testing::rel_diff;

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

// One training forward and backward: main mean loss + factor/D·Σ_k L_k (tests/model/mtp_test.cc).
double objective(GPTModel& model, const MicroBatch& mb, bool backward, std::vector<double>* mtp = nullptr) {
  GPTModel::LossSums sums;
  model.take_mtp_losses();
  model.forward(0, mb, Tensor(), /*training=*/true, &sums);
  const std::vector<double> l = model.take_mtp_losses();
  if (backward) model.params().zero_grads();
  model.backward(0, Tensor(), static_cast<float>(1.0 / sums.tokens));
  double j = sums.loss_sum / sums.tokens;
  const ModelConfig& c = model.config();
  for (double v : l) j += c.mtp_loss_scaling_factor / static_cast<double>(c.mtp_num_layers) * v;
  if (mtp) *mtp = l;
  return j;
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
  objective(model, mb, true, &mtp);
  ASSERT_EQ(mtp.size(), 2u);
  EXPECT_GT(mtp[0], 0.0);
  EXPECT_GT(mtp[1], 0.0);
  ParamBuffer& pb = model.params();
  const std::vector<float> grads(pb.flat_grads().data<float>(), pb.flat_grads().data<float>() + pb.numel());
  auto loss = [&] { return objective(model, mb, false); };
  int mtp_params = 0;
  for (int id = 0; id < pb.size(); ++id) {
    const int64_t n = pb.spec(id).local_numel();
    mtp_params += pb.spec(id).name.rfind("mtp.layers.", 0) == 0;
    const auto dir = random_vector(n, 100 + id);
    const double analytic = dot(grads.data() + pb.spec(id).offset, dir.data(), n);
    const double numeric = directional_derivative_5point(loss, pb.param_data(id), dir.data(), n, 5e-3);
    EXPECT_LT(rel_diff(analytic, numeric, 1e-2), 1e-2) << pb.spec(id).name << ": " << analytic << " vs " << numeric;
  }
  EXPECT_GT(mtp_params, 10);
}

}  // namespace
}  // namespace gale
