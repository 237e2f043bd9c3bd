// mHC (--enable-mhc-connections): the HyperConnectionModule's mappings, Sinkhorn projection,
// aggregation and residual merge, forward and every gradient, against Megatron-LM main's own module
// in float64 (tests/data/reference/mhc, tools/reference/mhc_reference.py); Sinkhorn's output doubly
// stochastic and its gradient against finite differences; finite differences of every parameter of
// whole GPT, LLaMA-style and MLA models with mHC.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/gpt_model.h"
#include "model/hyper_connection.h"
#include "model/sinkhorn.h"
#include "mla_test_config.h"
#include "model_test_batches.h"
#include "testing.h"

namespace gale {
namespace {

std::vector<float> floats(const nlohmann::json& j) { return j.get<std::vector<float>>(); }

Tensor tensor_of(const nlohmann::json& j, Shape shape) {
  const std::vector<float> v = floats(j);
  Tensor t = Tensor::empty(shape);
  EXPECT_EQ(static_cast<int64_t>(v.size()), t.numel());
  std::copy(v.begin(), v.end(), t.data<float>());
  return t;
}

void expect_close(const float* got, const nlohmann::json& want, const char* what, double tol) {
  const std::vector<double> w = want.get<std::vector<double>>();
  double scale = 0.0, worst = 0.0;
  for (size_t i = 0; i < w.size(); ++i) {
    scale = std::max(scale, std::abs(w[i]));
    worst = std::max(worst, std::abs(double(got[i]) - w[i]));
  }
  EXPECT_LE(worst, tol * std::max(scale, 1.0)) << what;
}

TEST(HyperConnection, ForwardAndGradientsMatchMegatronsModule) {
  std::ifstream in(std::string(GALE_TEST_DATA_DIR) + "/reference/mhc/hyper_connection_golden.json");
  ASSERT_TRUE(in.good());
  const nlohmann::json ref = nlohmann::json::parse(in);
  const OpTable ops = reference_ops();
  ASSERT_EQ(ref["cases"].size(), 3u);
  for (const nlohmann::json& k : ref["cases"]) {
    const int64_t n = k["n"], H = k["H"], T = int64_t(k["s"]) * int64_t(k["b"]);
    ModelConfig c;
    c.hidden = H;
    c.mhc.enabled = true;
    c.mhc.streams = n;
    c.mhc.sinkhorn_iterations = k["iterations"];
    ParamBuffer pb;
    const HyperConnectionIds w = register_hyper_connection_params(pb, c, single_process_partition(c), "hc");
    pb.finalize();
    pb.set_param_values(w.mapping_proj, floats(k["mapping_proj"]).data());
    pb.set_param_values(w.bias, floats(k["bias"]).data());
    const float ap = k["alpha_pre"], apo = k["alpha_post"], ar = k["alpha_res"];
    pb.set_param_values(w.alpha_pre, &ap);
    pb.set_param_values(w.alpha_post, &apo);
    pb.set_param_values(w.alpha_res, &ar);
    pb.zero_grads();
    const Tensor x = tensor_of(k["x"], {T, n * H});
    const std::vector<float> g = floats(k["g"]), bias_f = floats(k["bias_f"]);
    HyperConnectionSaved s;
    const Tensor a = hc_pre_forward(c, ops, pb, w, x, &s);
    Tensor y = Tensor::empty({T, H});
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < H; ++j) y.data<float>()[t * H + j] = a.data<float>()[t * H + j] * g[j] + bias_f[j];
    const Tensor out = hc_post_forward(ops, y, &s, DropoutSpec{});
    expect_close(s.h_pre.data<float>(), k["h_pre"], "h_pre", 1e-5);
    expect_close(s.h_post.data<float>(), k["h_post"], "h_post", 1e-5);
    expect_close(s.h_res.data<float>(), k["h_res"], "h_res", 1e-5);
    expect_close(a.data<float>(), k["a"], "aggregated", 1e-5);
    expect_close(out.data<float>(), k["out"], "out", 1e-5);
    // loss = Σ out ⊙ R
    const Tensor d_out = tensor_of(k["R"], {T, n * H});
    Tensor d_x, d_h_post, d_h_res;
    const Tensor d_y = hc_post_backward(ops, s, d_out, DropoutSpec{}, &d_x, &d_h_post, &d_h_res);
    Tensor d_a = Tensor::empty({T, H});
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < H; ++j) d_a.data<float>()[t * H + j] = d_y.data<float>()[t * H + j] * g[j];
    hc_pre_backward(c, ops, pb, w, s, d_a, d_h_post, d_h_res, d_x);
    expect_close(d_x.data<float>(), k["d_x"], "d_x", 1e-4);
    expect_close(pb.grad_data(w.mapping_proj), k["d_mapping_proj"], "d mapping_proj", 1e-4);
    expect_close(pb.grad_data(w.bias), k["d_bias"], "d bias", 1e-4);
    EXPECT_NEAR(pb.grad_data(w.alpha_pre)[0], double(k["d_alpha_pre"]), 1e-4 * std::max(1.0, std::abs(double(k["d_alpha_pre"]))));
    EXPECT_NEAR(pb.grad_data(w.alpha_post)[0], double(k["d_alpha_post"]), 1e-4 * std::max(1.0, std::abs(double(k["d_alpha_post"]))));
    EXPECT_NEAR(pb.grad_data(w.alpha_res)[0], double(k["d_alpha_res"]), 1e-4 * std::max(1.0, std::abs(double(k["d_alpha_res"]))));
  }
}

TEST(HyperConnection, SinkhornGivesADoublyStochasticMatrixAndItsGradientMatchesFiniteDifferences) {
  const int64_t n = 4, iters = 30;
  std::vector<float> logits = testing::random_vector(n * n, 5);
  for (float& v : logits) v *= 3.0f;
  std::vector<float> m0(n * n), out(n * n);
  sinkhorn_forward(logits.data(), m0.data(), out.data(), n, iters);
  for (int64_t i = 0; i < n; ++i) {
    double row = 0, col = 0;
    for (int64_t j = 0; j < n; ++j) {
      row += out[i * n + j];
      col += out[j * n + i];
    }
    EXPECT_NEAR(col, 1.0, 1e-6);  // the last step normalises the columns
    EXPECT_NEAR(row, 1.0, 1e-3);
  }
  const std::vector<float> d_out = testing::random_vector(n * n, 6);
  std::vector<float> d_logits(n * n);
  sinkhorn_backward(m0.data(), d_out.data(), d_logits.data(), n, iters);
  for (int64_t k = 0; k < n * n; ++k) {
    auto f = [&](double step) {
      std::vector<float> l = logits, m(n * n), o(n * n);
      l[k] += static_cast<float>(step);
      sinkhorn_forward(l.data(), m.data(), o.data(), n, iters);
      double s = 0;
      for (int64_t i = 0; i < n * n; ++i) s += double(o[i]) * d_out[i];
      return s;
    };
    const double h = 1e-2, numeric = (f(h) - f(-h)) / (2 * h);
    EXPECT_NEAR(d_logits[k], numeric, 2e-3 * std::max(1.0, std::abs(numeric))) << k;
  }
}

ModelConfig mhc_config(bool llama) {
  ModelConfig c = testing::gradcheck_gpt_config();
  if (llama) use_llama_architecture(c);
  c.attention_dropout = c.hidden_dropout = 0.0f;
  c.mhc.enabled = true;
  c.mhc.streams = 3;
  c.mhc.sinkhorn_iterations = 6;
  c.mhc.init_gating_factor = 0.5f;  // mappings far from their near-constant start
  return c;
}

TEST(HyperConnection, EveryParameterOfAnMhcGptMatchesFiniteDifferences) {
  const ModelConfig c = mhc_config(false);
  OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  const ParamBuffer& pb = model.params();
  ASSERT_GE(pb.find("decoder.layers.1.mlp_hyper_connection.alpha_res"), 0);
  EXPECT_EQ(pb.spec(pb.find("decoder.layers.0.self_attention_hyper_connection.mapping_proj.weight")).global_shape,
            (Shape{3 * 3 + 2 * 3, 3 * c.hidden}));
  testing::expect_every_parameter_matches_finite_differences(c);
}

TEST(HyperConnection, EveryParameterOfAnMhcLlamaMatchesFiniteDifferences) {
  testing::expect_every_parameter_matches_finite_differences(mhc_config(true));
}

// mHC around multi-latent attention (Megatron's HyperConnectionTransformerLayer takes any
// self-attention submodule): a DeepSeek-like MLA (query latent, latent norms, RMSNorm, SwiGLU, RoPE).
TEST(HyperConnection, EveryParameterOfAnMhcMlaModelMatchesFiniteDifferences) {
  ModelConfig c = testing::mla_config(/*llama=*/true, /*q_lora_rank=*/6, /*qk_layernorm=*/true, /*v_head_dim=*/3);
  const ModelConfig m = mhc_config(true);
  c.attention_dropout = c.hidden_dropout = 0.0f;
  c.mhc = m.mhc;
  OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  ASSERT_GE(model.params().find("decoder.layers.0.self_attention.linear_kv_down_proj.weight"), 0);
  ASSERT_GE(model.params().find("decoder.layers.1.self_attention_hyper_connection.mapping_proj.weight"), 0);
  testing::expect_every_parameter_matches_finite_differences(c);
}

}  // namespace
}  // namespace gale
