// Multi-token prediction on a Gated DeltaNet model (a GDN layer, then a full-attention layer; the
// MTP layers are full-attention layers, as Megatron's take the last decoder layer's spec):
// finite-difference gradients of every parameter of the loss main + factor/D·Σ L_k, the GDN
// layer's included (the MTP losses reach it through the decoder's hidden states).
#include <gtest/gtest.h>

#include <string>

#include "model/gpt_model.h"
#include "model_test_batches.h"
#include "mtp_gradcheck.h"
#include "testing.h"

namespace gale {
namespace {

using testing::expect_mtp_gradients_match;

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


TEST(MtpGdn, EveryParameterMatchesFiniteDifferences) {
  const ModelConfig c = small_gdn_mtp();
  const OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  model.params().initialize(42);
  const MicroBatch mb = testing::masked_batch(c, 2, 7, /*documents=*/false);
  std::vector<double> mtp;
  // A step of 1e-3 (5e-3, tests/model/mtp_test.cc's, is too coarse for the GDN convolution's weight).
  const std::vector<std::string> names = expect_mtp_gradients_match(model, mb, 1e-3, &mtp);
  ASSERT_EQ(mtp.size(), 2u);
  EXPECT_GT(mtp[0], 0.0);
  EXPECT_GT(testing::count_names(names, "mtp.layers."), 10);
  EXPECT_GT(testing::count_names(names, "decoder.layers.0.self_attention."), 3);
}

}  // namespace
}  // namespace gale
