// Multi-token prediction on a Gated DeltaNet model (a GDN layer, then a full-attention layer; the
// MTP layers are full-attention layers, as Megatron's take the last decoder layer's spec):
// finite-difference gradients of every parameter of the loss main + factor/D·Σ L_k, the GDN
// layer's included (the MTP losses reach it through the decoder's hidden states).
#include <gtest/gtest.h>

#include <string>

#include "model/gpt_model.h"
#include "model_test_batches.h"
#include "testing.h"

namespace gale {
namespace {

using testing::directional_derivative_5point;
using testing::dot;
using testing::random_vector;
using testing::rel_diff;

ModelConfig small_gdn_mtp() {
  ModelConfig c = testing::gradcheck_gpt_config();
  use_llama_architecture(c);  // SwiGLU and RMSNorm, as GDN needs
  c.mtp_num_layers = 2;
  c.mtp_loss_scaling_factor = 0.3;
  c.gdn.enabled = true;
  c.gdn.pattern = {1, 0};
  c.gdn.num_key_heads = 1;
  c.gdn.num_value_heads = 2;
  c.gdn.key_head_dim = 4;
  c.gdn.value_head_dim = 3;
  c.gdn.conv_kernel = 3;
  return c;
}

// One training forward and backward: the objective and its gradients (zeroed first when `backward`).
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

TEST(MtpGdn, EveryParameterMatchesFiniteDifferences) {
  const ModelConfig c = small_gdn_mtp();
  const OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  model.params().initialize(42);
  const MicroBatch mb = testing::masked_batch(c, 2, 7, /*documents=*/false);
  std::vector<double> mtp;
  objective(model, mb, true, &mtp);
  ASSERT_EQ(mtp.size(), 2u);
  EXPECT_GT(mtp[0], 0.0);
  ParamBuffer& pb = model.params();
  const std::vector<float> grads(pb.flat_grads().data<float>(), pb.flat_grads().data<float>() + pb.numel());
  // A step of 1e-3 (5e-3, tests/model/mtp_test.cc's, is too coarse for the GDN convolution's weight).
  auto loss = [&] { return objective(model, mb, false); };
  int mtp_params = 0, gdn_params = 0;
  for (int id = 0; id < pb.size(); ++id) {
    const std::string& name = pb.spec(id).name;
    const int64_t n = pb.spec(id).local_numel();
    mtp_params += name.rfind("mtp.layers.", 0) == 0;
    gdn_params += name.rfind("decoder.layers.0.self_attention.", 0) == 0;
    const auto dir = random_vector(n, 100 + id);
    const double analytic = dot(grads.data() + pb.spec(id).offset, dir.data(), n);
    const double numeric = directional_derivative_5point(loss, pb.param_data(id), dir.data(), n, 1e-3);
    EXPECT_LT(rel_diff(analytic, numeric, 1e-2), 1e-2) << name << ": " << analytic << " vs " << numeric;
  }
  EXPECT_GT(mtp_params, 10);
  EXPECT_GT(gdn_params, 3);
}

}  // namespace
}  // namespace gale
