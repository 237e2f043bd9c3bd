// The hybrid Mamba model (--is-hybrid-model) as a whole: finite-difference gradients of every
// parameter through Mamba ('M'), attention-only ('*') and MLP-only ('-') layers, and Megatron's names.
#include <gtest/gtest.h>

#include "model/gpt_model.h"
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

// Five-point directional derivatives in fp32 with h = 5e-3 (as tests/model/gpt_model_test.cc, whose
// tolerance discussion applies: 1% relative with a 1e-2 floor).
TEST(HybridModel, EveryParameterMatchesFiniteDifferences) {
  const ModelConfig c = hybrid_config();
  OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  model.params().initialize(42);
  MicroBatch mb = testing::masked_batch(c, 2, 7, false);
  testing::mean_loss(model, mb, true);
  ParamBuffer& pb = model.params();
  std::vector<float> grads(pb.flat_grads().data<float>(), pb.flat_grads().data<float>() + pb.numel());
  auto loss = [&] { return testing::mean_loss(model, mb, false); };
  for (int id = 0; id < pb.size(); ++id) {
    const int64_t n = pb.spec(id).local_numel();
    auto dir = testing::random_vector(n, 100 + id);
    const double analytic = testing::dot(grads.data() + pb.spec(id).offset, dir.data(), n);
    const double numeric = testing::directional_derivative_5point(loss, pb.param_data(id), dir.data(), n, 5e-3);
    EXPECT_LT(testing::rel_diff(analytic, numeric, 1e-2), 1e-2)
        << pb.spec(id).name << ": " << analytic << " vs " << numeric;
  }
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

}  // namespace
}  // namespace gale
