// The Mamba-2 mixer: float64 PyTorch golden values of its forward and backward
// (tools/reference/mamba_reference.py, the SSD quadratic form), finite-difference gradients of every
// parameter and the input, and Megatron's initial values.
#include "model/mamba_mixer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kernels/cpu/gemm.h"
#include "testing.h"
#include "mamba_test_mixer.h"
#include "testing_json.h"

namespace gale {
namespace {

// Two Mamba layers (the mixer tests use layer 0).
ModelConfig mixer_config(int64_t H, int64_t P, int64_t G, int64_t N, int64_t K) {
  return testing::mamba_mixer_config(2, H, P, G, N, K);
}

struct Mixer : testing::MambaTestMixer {
  using MambaTestMixer::MambaTestMixer;
  MambaMixerWeights weights() { return mamba_mixer_weights(pb, w, sgemm, gemm_bf16); }
  Tensor forward(const Tensor& u, int64_t S, int64_t B, MambaMixerSaved* saved) {
    return mamba_mixer_forward(d, weights(), u, S, B, DType::kF32, saved);
  }
  // Σ r·out in double.
  double loss(const Tensor& u, const Tensor& r, int64_t S, int64_t B) {
    Tensor out = forward(u, S, B, nullptr);
    double l = 0.0;
    for (int64_t i = 0; i < out.numel(); ++i) l += static_cast<double>(out.data<float>()[i]) * r.data<float>()[i];
    return l;
  }
};

TEST(MambaMixerGolden, ForwardAndBackwardMatchTheFloat64Reference) {
  std::ifstream in(std::string(GALE_TEST_DATA_DIR) + "/reference/mamba/golden.json");
  ASSERT_TRUE(in.good());
  const nlohmann::json g = nlohmann::json::parse(in);
  const auto& dims = g["dims"];
  const int64_t S = dims["S"], B = dims["B"];
  ModelConfig c = mixer_config(dims["H"], dims["headdim"], dims["ngroups"], dims["d_state"], dims["d_conv"]);
  ASSERT_EQ(c.hybrid.expand, dims["expand"].get<int64_t>());
  Mixer m(c);
  const std::vector<std::pair<const char*, int>> params = {
      {"w_in", m.w.in_proj}, {"conv_w", m.w.conv_w}, {"conv_b", m.w.conv_b}, {"a_log", m.w.a_log},
      {"d", m.w.d}, {"dt_bias", m.w.dt_bias}, {"norm_w", m.w.gnorm_w}, {"w_out", m.w.out_proj}};
  ASSERT_NO_FATAL_FAILURE(testing::set_params_from_json(m.pb, params, g["inputs"]));
  const Tensor u = testing::json_tensor(g["inputs"]["u"], S * B, c.hidden);
  const Tensor r = testing::json_tensor(g["r"], S * B, c.hidden);
  MambaMixerSaved saved;
  Tensor out = m.forward(u, S, B, &saved);
  testing::expect_near_reference(out.data<float>(), testing::json_floats(g["out"]), "out");
  Tensor du = mamba_mixer_backward(m.d, m.weights(), saved, r, S, B);
  testing::expect_near_reference(du.data<float>(), testing::json_floats(g["grads"]["u"]), "d u");
  for (const auto& [name, id] : params) testing::expect_near_reference(m.pb.grad_data(id), testing::json_floats(g["grads"][name]), name);
  EXPECT_FALSE(saved.zxbcdt.defined());  // backward released what forward kept
}

// Central differences of L = Σ r·out in f32 (step 1e-2): the forward's rounding (~1e-5 on L) gives
// ~1e-3 of noise and the step ~1e-4 of truncation error, well inside 5e-3 + 2e-2·|g|.
TEST(MambaMixerGradients, MatchFiniteDifferencesForEveryParameterAndTheInput) {
  ModelConfig c = mixer_config(/*H=*/6, /*P=*/3, /*G=*/2, /*N=*/2, /*K=*/3);
  Mixer m(c);
  const int64_t S = 5, B = 2, T = S * B;
  for (int id : m.w.all()) {  // away from the initial values' symmetries (D = 1, norm = 1)
    std::vector<float> v(static_cast<size_t>(m.pb.spec(id).local_numel()));
    testing::fill_random(v.data(), static_cast<int64_t>(v.size()), 100 + static_cast<uint64_t>(id), 0.5f);
    const float* cur = m.pb.param_data(id);
    for (size_t i = 0; i < v.size(); ++i) v[i] += cur[i];
    m.pb.set_param_values(id, v.data());
  }
  // Δ ≈ 1 and A ≈ −0.5 (exp(Δ·A) ≈ 0.6), so that every path through the state is well measured
  // (Megatron's initial Δ ≤ 0.1 makes the Δ gradients small, its A up to −16 forgets within a step).
  {
    std::vector<float> a(static_cast<size_t>(m.d.NH)), dt(static_cast<size_t>(m.d.NH));
    testing::fill_random(a.data(), m.d.NH, 77, 0.3f);
    testing::fill_random(dt.data(), m.d.NH, 78, 0.3f);
    for (float& v : a) v -= 0.7f;
    for (float& v : dt) v += 0.5f;
    m.pb.set_param_values(m.w.a_log, a.data());
    m.pb.set_param_values(m.w.dt_bias, dt.data());
  }
  Tensor u = Tensor::empty({T, c.hidden}), r = Tensor::empty({T, c.hidden});
  testing::fill_random(u.data<float>(), u.numel(), 5);
  testing::fill_random(r.data<float>(), r.numel(), 6);
  MambaMixerSaved saved;
  m.forward(u, S, B, &saved);
  Tensor du = mamba_mixer_backward(m.d, m.weights(), saved, r, S, B);
  const float eps = 1e-2f;
  auto check = [&](float* x, const float* analytic, int64_t n, const std::string& what) {
    for (int64_t i = 0; i < n; ++i) {
      const float keep = x[i];
      x[i] = keep + eps;
      const double lp = m.loss(u, r, S, B);
      x[i] = keep - eps;
      const double lm = m.loss(u, r, S, B);
      x[i] = keep;
      const double fd = (lp - lm) / (2.0 * eps);
      ASSERT_NEAR(analytic[i], fd, 5e-3 + 2e-2 * std::fabs(fd)) << what << " [" << i << "]";
    }
  };
  check(u.data<float>(), du.data<float>(), u.numel(), "u");
  for (int id : m.w.all()) {
    if (id == m.w.norm_w) continue;  // the layer's pre-norm is not part of the mixer
    check(m.pb.param_data(id), m.pb.grad_data(id), m.pb.spec(id).local_numel(), m.pb.spec(id).name);
  }
}

// Megatron's initial values and parameter names.
TEST(MambaMixerParams, MegatronNamesShapesAndInitialValues) {
  ModelConfig c = mixer_config(16, 8, 2, 4, 4);
  c.num_layers = 4;
  c.hybrid.layers = "MMMM";
  Mixer m(c);
  const MambaDims& d = m.d;
  EXPECT_EQ(d.DI, 32);
  EXPECT_EQ(d.NH, 4);
  EXPECT_EQ(m.pb.spec(m.w.in_proj).name, "decoder.layers.0.mixer.in_proj.weight");
  EXPECT_EQ(m.pb.spec(m.w.in_proj).global_shape, (Shape{2 * 32 + 2 * 2 * 4 + 4, 16}));
  EXPECT_EQ(m.pb.spec(m.w.conv_w).name, "decoder.layers.0.mixer.conv1d.weight");
  EXPECT_EQ(m.pb.spec(m.w.conv_w).global_shape, (Shape{32 + 16, 4}));  // Megatron: [CD, 1, K]
  EXPECT_EQ(m.pb.spec(m.w.norm_w).name, "decoder.layers.0.mixer.in_proj.layer_norm_weight");
  EXPECT_EQ(m.pb.spec(m.w.gnorm_w).name, "decoder.layers.0.mixer.norm.weight");
  EXPECT_EQ(m.pb.spec(m.w.out_proj).name, "decoder.layers.0.mixer.out_proj.weight");
  for (int id : {m.w.a_log, m.w.d, m.w.dt_bias, m.w.conv_b, m.w.gnorm_w}) EXPECT_FALSE(m.pb.spec(id).weight_decay);
  const float* a_log = m.pb.param_data(m.w.a_log);
  const float* dt_bias = m.pb.param_data(m.w.dt_bias);
  for (int64_t h = 0; h < d.NH; ++h) {
    EXPECT_GE(std::exp(a_log[h]), 1.0f - 1e-5f);
    EXPECT_LE(std::exp(a_log[h]), 16.0f + 1e-4f);
    const float dt = std::log1p(std::exp(dt_bias[h]));  // softplus(dt_bias) in [0.001, 0.1]
    EXPECT_GE(dt, 0.001f * (1 - 1e-4f));
    EXPECT_LE(dt, 0.1f * (1 + 1e-4f));
    EXPECT_EQ(m.pb.param_data(m.w.d)[h], 1.0f);
  }
  const float* conv = m.pb.param_data(m.w.conv_w);
  for (int64_t i = 0; i < m.pb.spec(m.w.conv_w).local_numel(); ++i) EXPECT_LE(std::fabs(conv[i]), 0.5f);
  EXPECT_NEAR(m.pb.spec(m.w.out_proj).init_std, 0.02f / 2.0f, 1e-7f);  // σ/√L, L = 4
}

}  // namespace
}  // namespace gale
