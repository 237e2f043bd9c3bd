// Shared checks of one Gated DeltaNet mixer, GDN (GdnConfig::pattern entry 1) or GDN2 (entry 2):
// golden values from a float64 reference fixture, five-point finite differences of every parameter
// and the input, and causality (tests/model/gated_delta_net_test.cc, gated_delta_net2_test.cc).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "model/gated_delta_net.h"
#include "testing.h"
#include "testing_json.h"

namespace gale::gdn_checks {

// A 2-layer config whose first layer is a mixer of `kind` (1: GDN, 2: GDN2), the second attention.
inline ModelConfig mixer_config(int kind, int64_t H, int64_t NK, int64_t NV, int64_t DK, int64_t DV, int64_t K) {
  ModelConfig c;
  c.num_layers = 2;
  c.hidden = H;
  c.rms_norm = true;
  c.gdn.enabled = true;
  c.gdn.pattern = {kind, 0};
  c.gdn.num_key_heads = NK;
  c.gdn.num_value_heads = NV;
  c.gdn.key_head_dim = DK;
  c.gdn.value_head_dim = DV;
  c.gdn.conv_kernel = K;
  return c;
}

// Layer 0's mixer on its own parameter buffer (seed 11).
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

// The fixture's (tests/data/<fixture>) output and gradients of u and every parameter for its inputs.
inline void expect_golden(int kind, const std::string& fixture) {
  std::ifstream in(std::string(GALE_TEST_DATA_DIR) + "/" + fixture);
  ASSERT_TRUE(in.good()) << fixture;
  const nlohmann::json g = nlohmann::json::parse(in);
  const auto& dims = g["dims"];
  const int64_t S = dims["S"], B = dims["B"];
  ModelConfig c = mixer_config(kind, dims["H"], dims["NK"], dims["NV"], dims["DK"], dims["DV"], dims["K"]);
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
  for (const auto& [name, id] : params)
    testing::expect_near_reference(m.pb.grad_data(id), testing::json_floats(g["grads"][name]), name);
  EXPECT_FALSE(saved.defined());  // backward released what forward kept
}

// Five-point differences of L = Σ r·out in f32 (step 2e-3; the l2norm of short q/k vectors is sharply
// curved, so central differences with a larger step miss by up to 50%): forward rounding (~1e-6 on L)
// gives ~1e-3 of noise, inside 5e-3 + 2e-2·|g|. Odd sizes, two value heads per key head, and decays
// exp(g) around 0.5 so that the state carries over several steps; every entry, or every 7th.
inline void expect_gradients(int kind, int64_t S, int64_t B, bool every_entry) {
  ModelConfig c = mixer_config(kind, /*H=*/5, /*NK=*/1, /*NV=*/2, /*DK=*/3, /*DV=*/3, /*K=*/3);
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
  for (int id : m.w.all())
    check(m.pb.param_data(id), m.pb.grad_data(id), m.pb.spec(id).local_numel(), m.pb.spec(id).name);
}

// The output at position s depends on no later position (the convolution and the recurrence are causal).
inline void expect_causal(int kind) {
  Mixer m(mixer_config(kind, 6, 2, 4, 3, 2, 4));
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

}  // namespace gale::gdn_checks
