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
#include "testing.h"
#include "testing_json.h"

namespace gale {
namespace {

ModelConfig gdn2_config(int64_t H, int64_t NK, int64_t NV, int64_t DK, int64_t DV, int64_t K) {
  ModelConfig c;
  c.num_layers = 2;
  c.hidden = H;
  c.rms_norm = true;
  c.gdn.enabled = true;
  c.gdn.pattern = {2, 0};  // 2: a GDN2 layer
  c.gdn.num_key_heads = NK;
  c.gdn.num_value_heads = NV;
  c.gdn.key_head_dim = DK;
  c.gdn.value_head_dim = DV;
  c.gdn.conv_kernel = K;
  return c;
}

struct Mixer {
  ModelConfig c;
  GdnDims d;
  ParamBuffer pb;
  GdnParamIds w;
  explicit Mixer(const ModelConfig& config) : c(config), d(GdnDims::of(config)) {
    w = register_gdn_params(pb, c, 0);
    pb.finalize();
    pb.initialize(11);
  }
  GdnWeights weights() { return gdn_weights(c, pb, w, sgemm, gemm_bf16); }
  Tensor forward(const Tensor& u, int64_t S, int64_t B, GdnSaved* saved) {
    return gdn_forward(d, weights(), u, S, B, DType::kF32, saved);
  }
  double loss(const Tensor& u, const Tensor& r, int64_t S, int64_t B) {  // Σ r·out in double
    Tensor out = forward(u, S, B, nullptr);
    double l = 0.0;
    for (int64_t i = 0; i < out.numel(); ++i) l += static_cast<double>(out.data<float>()[i]) * r.data<float>()[i];
    return l;
  }
};

TEST(GatedDeltaNet2Golden, ForwardAndBackwardMatchTheFloat64Reference) {
  std::ifstream in(std::string(GALE_TEST_DATA_DIR) + "/reference/gdn2/golden.json");
  ASSERT_TRUE(in.good());
  const nlohmann::json g = nlohmann::json::parse(in);
  const auto& dims = g["dims"];
  const int64_t S = dims["S"], B = dims["B"];
  ModelConfig c = gdn2_config(dims["H"], dims["NK"], dims["NV"], dims["DK"], dims["DV"], dims["K"]);
  c.norm_eps = dims["norm_eps"].get<float>();
  Mixer m(c);
  const std::vector<std::pair<const char*, int>> params = {{"w_in", m.w.in_proj}, {"conv_w", m.w.conv_w},
                                                           {"dt_bias", m.w.dt_bias}, {"a_log", m.w.a_log},
                                                           {"norm_w", m.w.out_norm_w}, {"w_out", m.w.out_proj}};
  ASSERT_NO_FATAL_FAILURE(testing::set_params_from_json(m.pb, params, g["inputs"]));
  const Tensor u = testing::json_tensor(g["inputs"]["u"], S * B, c.hidden);
  const Tensor r = testing::json_tensor(g["r"], S * B, c.hidden);
  GdnSaved saved;
  Tensor out = m.forward(u, S, B, &saved);
  testing::expect_near_reference(out.data<float>(), testing::json_floats(g["out"]), "out");
  Tensor du = gdn_backward(m.d, m.weights(), saved, r, S, B);
  testing::expect_near_reference(du.data<float>(), testing::json_floats(g["grads"]["u"]), "d u");
  for (const auto& [name, id] : params) testing::expect_near_reference(m.pb.grad_data(id), testing::json_floats(g["grads"][name]), name);
  EXPECT_FALSE(saved.defined());  // backward released what forward kept
}

// Five-point differences of L = Σ r·out in f32 (step 2e-3), as GDN's check: odd sizes, two value heads
// per key head, decays exp(g) around 0.5 so that the state carries over several steps.
void check_gradients(int64_t S, int64_t B, bool every_entry) {
  ModelConfig c = gdn2_config(/*H=*/5, /*NK=*/1, /*NV=*/2, /*DK=*/3, /*DV=*/3, /*K=*/3);
  Mixer m(c);
  for (int id : m.w.all()) {
    std::vector<float> v(static_cast<size_t>(m.pb.spec(id).local_numel()));
    testing::fill_random(v.data(), static_cast<int64_t>(v.size()), 100 + static_cast<uint64_t>(id), 0.5f);
    const float* cur = m.pb.param_data(id);
    for (size_t i = 0; i < v.size(); ++i) v[i] += cur[i];
    m.pb.set_param_values(id, v.data());
  }
  {
    std::vector<float> a(static_cast<size_t>(m.d.a_log_dim())), dt(static_cast<size_t>(m.d.dt_bias_dim()));
    testing::fill_random(a.data(), static_cast<int64_t>(a.size()), 77, 0.3f);
    testing::fill_random(dt.data(), static_cast<int64_t>(dt.size()), 78, 0.3f);
    for (float& v : a) v -= 0.7f;
    m.pb.set_param_values(m.w.a_log, a.data());
    m.pb.set_param_values(m.w.dt_bias, dt.data());
  }
  const int64_t T = S * B;
  Tensor u = Tensor::empty({T, c.hidden}), r = Tensor::empty({T, c.hidden});
  testing::fill_random(u.data<float>(), u.numel(), 5);
  testing::fill_random(r.data<float>(), r.numel(), 6);
  GdnSaved saved;
  m.forward(u, S, B, &saved);
  Tensor du = gdn_backward(m.d, m.weights(), saved, r, S, B);
  const float eps = 2e-3f;
  auto check = [&](float* x, const float* analytic, int64_t n, const std::string& what) {
    const int64_t step = every_entry ? 1 : 7;
    for (int64_t i = 0; i < n; i += step) {
      const float keep = x[i];
      auto at = [&](float dx) {
        x[i] = keep + dx;
        const double l = m.loss(u, r, S, B);
        x[i] = keep;
        return l;
      };
      const double fd = (8.0 * (at(eps) - at(-eps)) - (at(2 * eps) - at(-2 * eps))) / (12.0 * eps);
      ASSERT_NEAR(analytic[i], fd, 5e-3 + 2e-2 * std::fabs(fd)) << what << " [" << i << "]";
    }
  };
  check(u.data<float>(), du.data<float>(), u.numel(), "u");
  for (int id : m.w.all()) check(m.pb.param_data(id), m.pb.grad_data(id), m.pb.spec(id).local_numel(), m.pb.spec(id).name);
}

TEST(GatedDeltaNet2Gradients, MatchFiniteDifferencesForEveryParameterAndTheInput) { check_gradients(5, 2, true); }

// 131 positions: backward recomputes three chunks of states (64, 64, 3) from their checkpoints.
TEST(GatedDeltaNet2Gradients, MatchFiniteDifferencesAcrossBackwardChunks) { check_gradients(131, 1, false); }

// The output at position s depends on no later position.
TEST(GatedDeltaNet2Forward, IsCausal) {
  Mixer m(gdn2_config(6, 2, 4, 3, 2, 4));
  const int64_t S = 9, B = 2, T = S * B;
  Tensor u = Tensor::empty({T, 6});
  testing::fill_random(u.data<float>(), u.numel(), 9);
  Tensor a = m.forward(u, S, B, nullptr);
  for (int64_t i = 5 * B * 6; i < T * 6; ++i) u.data<float>()[i] += 0.7f;  // change positions 5..8
  Tensor b = m.forward(u, S, B, nullptr);
  for (int64_t i = 0; i < 5 * B * 6; ++i) EXPECT_EQ(a.data<float>()[i], b.data<float>()[i]) << i;
  double diff = 0.0;
  for (int64_t i = 5 * B * 6; i < T * 6; ++i) diff += std::fabs(a.data<float>()[i] - b.data<float>()[i]);
  EXPECT_GT(diff, 1e-3);
}

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
