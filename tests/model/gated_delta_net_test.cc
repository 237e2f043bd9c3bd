// The Gated DeltaNet mixer: float64 numpy golden values (tools/reference/gated_delta_net_reference.py),
// finite-difference gradients of every parameter and the input (also across backward's 64-step
// chunks), and Megatron's parameter names and initial values (in a GDN model with MoE layers too).
#include "model/gated_delta_net.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kernels/cpu/gemm.h"
#include "model/gdn_mixer_checks.h"
#include "model/gpt_model.h"
#include "testing.h"
#include "testing_json.h"

namespace gale {
namespace {

using gdn_checks::Mixer;

ModelConfig gdn_config(int64_t H, int64_t NK, int64_t NV, int64_t DK, int64_t DV, int64_t K) {
  return gdn_checks::mixer_config(1, H, NK, NV, DK, DV, K);
}

TEST(GatedDeltaNetGolden, ForwardAndBackwardMatchTheFloat64Reference) { gdn_checks::expect_golden(1, "reference/gdn/golden.json"); }

TEST(GatedDeltaNetGradients, MatchFiniteDifferencesForEveryParameterAndTheInput) { gdn_checks::expect_gradients(1, 5, 2, true); }

// 131 positions: backward recomputes three chunks of states (64, 64, 3) from their checkpoints.
TEST(GatedDeltaNetGradients, MatchFiniteDifferencesAcrossBackwardChunks) { gdn_checks::expect_gradients(1, 131, 1, false); }

TEST(GatedDeltaNetForward, IsCausal) { gdn_checks::expect_causal(1); }

TEST(GatedDeltaNetParams, MegatronNamesShapesAndInitialValues) {
  ModelConfig c = gdn_config(16, 2, 4, 8, 6, 4);
  c.num_layers = 4;
  c.gdn.pattern = {1, 1, 1, 0};
  Mixer m(c);
  const GdnDims& d = m.d;
  EXPECT_EQ(d.conv_dim(), 2 * 16 + 24);
  EXPECT_EQ(m.pb.spec(m.w.in_proj).name, "decoder.layers.0.self_attention.in_proj.weight");
  EXPECT_EQ(m.pb.spec(m.w.in_proj).global_shape, (Shape{2 * 16 + 2 * 24 + 2 * 4, 16}));
  EXPECT_EQ(m.pb.spec(m.w.conv_w).name, "decoder.layers.0.self_attention.conv1d.weight");
  EXPECT_EQ(m.pb.spec(m.w.conv_w).global_shape, (Shape{56, 4}));  // Megatron: [CD, 1, K]
  EXPECT_EQ(m.pb.spec(m.w.dt_bias).name, "decoder.layers.0.self_attention.dt_bias");
  EXPECT_EQ(m.pb.spec(m.w.a_log).name, "decoder.layers.0.self_attention.A_log");
  EXPECT_EQ(m.pb.spec(m.w.out_norm_w).name, "decoder.layers.0.self_attention.out_norm.weight");
  EXPECT_EQ(m.pb.spec(m.w.out_norm_w).global_shape, (Shape{6}));
  EXPECT_EQ(m.pb.spec(m.w.out_proj).name, "decoder.layers.0.self_attention.out_proj.weight");
  EXPECT_EQ(m.pb.spec(m.w.out_proj).global_shape, (Shape{16, 24}));
  for (int id : {m.w.a_log, m.w.dt_bias, m.w.out_norm_w}) EXPECT_FALSE(m.pb.spec(id).weight_decay);
  for (int64_t h = 0; h < d.NV; ++h) {
    const float a = std::exp(m.pb.param_data(m.w.a_log)[h]);
    EXPECT_GE(a, 1.0f - 1e-5f);
    EXPECT_LE(a, 16.0f + 1e-4f);
    EXPECT_EQ(m.pb.param_data(m.w.dt_bias)[h], 1.0f);
  }
  for (int64_t j = 0; j < d.DV; ++j) EXPECT_EQ(m.pb.param_data(m.w.out_norm_w)[j], 1.0f);
  const float* conv = m.pb.param_data(m.w.conv_w);
  for (int64_t i = 0; i < m.pb.spec(m.w.conv_w).local_numel(); ++i) EXPECT_LE(std::fabs(conv[i]), 0.5f);
  EXPECT_NEAR(m.pb.spec(m.w.in_proj).init_std, 0.02f, 1e-7f);
  EXPECT_NEAR(m.pb.spec(m.w.out_proj).init_std, 0.02f / std::sqrt(8.0f), 1e-7f);  // σ/√(2L), L = 4
}

// A GDN model's norms are fused into the next linear (Megatron builds it with Transformer Engine's
// spec), except before a MoE MLP, which has no linear_fc1: there the spec keeps pre_mlp_layernorm.
TEST(GatedDeltaNetParams, MoeLayersKeepPreMlpLayernorm) {
  ModelConfig c = gdn_config(16, 2, 4, 8, 6, 4);
  c.ffn = 24;
  c.heads = 2;
  c.kv_heads = 2;
  c.head_dim = 8;
  c.vocab = 32;
  c.seq_length = 8;
  c.max_positions = 16;
  c.swiglu = true;
  c.add_bias_linear = false;
  c.moe.num_experts = 2;
  c.moe.topk = 1;
  c.moe.ffn = 8;
  c.moe.pattern = {1, 0};
  OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  const ParamBuffer& pb = model.params();
  for (const char* name : {"decoder.layers.0.self_attention.in_proj.layer_norm_weight",
                           "decoder.layers.0.pre_mlp_layernorm.weight", "decoder.layers.0.mlp.router.weight",
                           "decoder.layers.1.mlp.linear_fc1.layer_norm_weight"})
    EXPECT_GE(pb.find(name), 0) << name;
  for (const char* name : {"decoder.layers.0.mlp.linear_fc1.layer_norm_weight", "decoder.layers.1.pre_mlp_layernorm.weight"})
    EXPECT_LT(pb.find(name), 0) << name;
}

}  // namespace
}  // namespace gale
