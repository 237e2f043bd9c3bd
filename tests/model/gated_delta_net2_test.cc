// The Gated DeltaNet-2 mixer (GdnDims::gdn2, GdnConfig::pattern entries 2): float64 torch golden values
// (tools/reference/gated_delta_net2_reference.py), finite-difference gradients of every parameter and
// the input (also across backward's 64-step chunks), causality, and Megatron's GatedDeltaNet2
// parameter names, shapes and initial values.
#include "model/gated_delta_net.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kernels/cpu/gemm.h"
#include "model/gdn_mixer_checks.h"
#include "testing.h"
#include "testing_json.h"

namespace gale {
namespace {

using gdn_checks::Mixer;

ModelConfig gdn2_config(int64_t H, int64_t NK, int64_t NV, int64_t DK, int64_t DV, int64_t K) {
  return gdn_checks::mixer_config(2, H, NK, NV, DK, DV, K);
}

TEST(GatedDeltaNet2Golden, ForwardAndBackwardMatchTheFloat64Reference) { gdn_checks::expect_golden(2, "reference/gdn2/golden.json"); }

TEST(GatedDeltaNet2Gradients, MatchFiniteDifferencesForEveryParameterAndTheInput) { gdn_checks::expect_gradients(2, 5, 2, true); }

// 131 positions: backward recomputes three chunks of states (64, 64, 3) from their checkpoints.
TEST(GatedDeltaNet2Gradients, MatchFiniteDifferencesAcrossBackwardChunks) { gdn_checks::expect_gradients(2, 131, 1, false); }

TEST(GatedDeltaNet2Forward, IsCausal) { gdn_checks::expect_causal(2); }

// Megatron's GatedDeltaNet2: the same names as GDN's, in_proj [4·NK·DK + 3·NV·DV, H] (query, key,
// value, z, f, b, w), dt_bias [NK·DK] = softplus⁻¹(Δ0) with Δ0 in [1e-3, 0.1], A_log [NK] = log U(1, 16).
TEST(GatedDeltaNet2Params, MegatronNamesShapesAndInitialValues) {
  ModelConfig c = gdn2_config(16, 2, 4, 8, 6, 4);
  c.num_layers = 4;
  c.gdn.pattern = {2, 2, 2, 0};
  Mixer m(c);
  const GdnDims& d = m.d;
  EXPECT_EQ(d.in_proj_sections(), (std::vector<int64_t>{16, 16, 24, 24, 16, 16, 24}));
  EXPECT_EQ(m.pb.spec(m.w.in_proj).name, "decoder.layers.0.self_attention.in_proj.weight");
  EXPECT_EQ(m.pb.spec(m.w.in_proj).global_shape, (Shape{4 * 16 + 3 * 24, 16}));
  EXPECT_EQ(m.pb.spec(m.w.conv_w).name, "decoder.layers.0.self_attention.conv1d.weight");
  EXPECT_EQ(m.pb.spec(m.w.conv_w).global_shape, (Shape{56, 4}));
  EXPECT_EQ(m.pb.spec(m.w.dt_bias).name, "decoder.layers.0.self_attention.dt_bias");
  EXPECT_EQ(m.pb.spec(m.w.dt_bias).global_shape, (Shape{16}));
  EXPECT_EQ(m.pb.spec(m.w.a_log).name, "decoder.layers.0.self_attention.A_log");
  EXPECT_EQ(m.pb.spec(m.w.a_log).global_shape, (Shape{2}));
  EXPECT_EQ(m.pb.spec(m.w.out_norm_w).global_shape, (Shape{6}));
  EXPECT_EQ(m.pb.spec(m.w.out_proj).global_shape, (Shape{16, 24}));
  for (int id : {m.w.a_log, m.w.dt_bias, m.w.out_norm_w}) EXPECT_FALSE(m.pb.spec(id).weight_decay);
  for (int64_t h = 0; h < d.NK; ++h) {
    const float a = std::exp(m.pb.param_data(m.w.a_log)[h]);
    EXPECT_GE(a, 1.0f - 1e-5f);
    EXPECT_LE(a, 16.0f + 1e-4f);
  }
  for (int64_t i = 0; i < d.qk_dim(); ++i) {
    const float dt = std::log1p(std::exp(m.pb.param_data(m.w.dt_bias)[i]));  // softplus
    EXPECT_GE(dt, 1e-3f * 0.999f) << i;
    EXPECT_LE(dt, 0.1f * 1.001f) << i;
  }
}

}  // namespace
}  // namespace gale
