// The MoE router under --calculate-per-token-loss (MoeRouterKey::per_token_loss) against float64 PyTorch
// golden values (tools/reference/per_token_moe_reference.py), and the --recompute-modules moe rerun
// of global_aux_loss (MoeRouterKey::global_aux_counts) reproducing its forward's gradient bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/moe_router.h"
#include "model/param_builders.h"
#include "testing.h"
#include "testing_json.h"

namespace gale {
namespace {

struct Router {
  ModelConfig c;
  OpTable ops = reference_ops();
  ParamBuffer pb;
  MoeRouterIds w;
  MoeGlobalAux global;

  explicit Router(const ModelConfig& config) : c(config), global(config.moe.num_experts, nullptr) {
    w.weight = pb.add(make_param_spec("router.weight", {c.moe.num_experts, c.hidden}, InitKind::kNormal, 0.5f, true));
    pb.finalize();
    pb.initialize(7);
    if (c.moe.global_aux_loss_coeff > 0.0) w.global_aux = &global;
  }
};

ModelConfig config_of(const nlohmann::json& g) {
  ModelConfig c;
  c.num_layers = 1;
  c.hidden = g["H"];
  c.moe.num_experts = g["E"];
  c.moe.topk = g["k"];
  c.moe.aux_loss_coeff = g["coeffs"]["aux_loss"];
  c.moe.seq_aux_loss_coeff = g["coeffs"]["seq_aux_loss"];
  c.moe.global_aux_loss_coeff = g["coeffs"]["global_aux_loss"];
  c.moe.z_loss_coeff = g["coeffs"]["z_loss"];
  return c;
}

nlohmann::json golden() {
  std::ifstream in(std::string(GALE_TEST_DATA_DIR) + "/reference/moe_router/per_token.json");
  EXPECT_TRUE(in.good());
  return nlohmann::json::parse(in);
}

// One step of M micro-batches through the router; returns the router weight's gradient as
// finalize_model_grads leaves it (per-token: divided by the step's loss tokens).
std::vector<double> step_gradient(const nlohmann::json& g, bool per_token, std::vector<MoeAuxLosses>* losses) {
  Router r(config_of(g));
  const int64_t M = g["M"], B = g["B"], S = g["S"], T = S * B, k = g["k"];
  const std::vector<float> W = testing::json_floats(g["W"]);
  std::copy(W.begin(), W.end(), r.pb.param_data(r.w.weight));
  r.pb.zero_grads();
  double total = 0.0;
  for (int64_t m = 0; m < M; ++m)
    for (double v : g["mask"][m].get<std::vector<double>>()) total += v;
  for (int64_t m = 0; m < M; ++m) {
    const std::vector<float> x = testing::json_floats(g["x"][m]), R = testing::json_floats(g["R"][m]);
    const std::vector<double> mask = g["mask"][m].get<std::vector<double>>();
    double tokens = 0.0;
    for (double v : mask) tokens += v;
    Tensor xt = Tensor::empty({T, r.c.hidden});
    std::copy(x.begin(), x.end(), xt.data<float>());
    MoeRouterKey key;
    key.per_token_loss = per_token;
    MoeRouterSaved saved;
    MoeAuxLosses l;
    moe_router_forward(r.c, r.ops, r.pb, r.w, xt, B, &saved, &l, nullptr, key);
    if (losses) losses->push_back(l);
    // The main loss's gradient through the routing weights: the schedule's scale times the mask.
    const double main_scale = per_token ? 1.0 : 1.0 / (tokens * static_cast<double>(M));
    Tensor dprobs = Tensor::empty({T, k});
    for (int64_t i = 0; i < T * k; ++i) dprobs.data<float>()[i] = static_cast<float>(R[i] * mask[i / k] * main_scale);
    // MoEAuxLossAutoScaler's scale: the loss scale (1) per token, else 1 / num_microbatches.
    moe_router_backward(r.c, r.ops, r.pb, r.w, saved, xt, dprobs, per_token ? 1.0 : 1.0 / static_cast<double>(M));
  }
  const float* dw = r.pb.grad_data(r.w.weight);
  std::vector<double> out(dw, dw + r.c.moe.num_experts * r.c.hidden);
  if (per_token)
    for (double& v : out) v /= total;
  return out;
}

TEST(MoeRouterPerTokenGolden, GradientsMatchTheFloat64Reference) {
  const nlohmann::json g = golden();
  for (const bool per_token : {true, false}) {
    SCOPED_TRACE(per_token ? "per_token" : "default");
    std::vector<MoeAuxLosses> losses;
    const std::vector<double> dw = step_gradient(g, per_token, &losses);
    const std::vector<double> want = g[per_token ? "dW_per_token" : "dW_default"].get<std::vector<double>>();
    ASSERT_EQ(dw.size(), want.size());
    for (size_t i = 0; i < dw.size(); ++i) EXPECT_NEAR(dw[i], want[i], 2e-5 * (1.0 + std::fabs(want[i]))) << "dW " << i;
    // The losses reported are the same in both modes (Megatron logs them unscaled).
    ASSERT_EQ(losses.size(), g["losses"].size());
    for (size_t m = 0; m < losses.size(); ++m) {
      const nlohmann::json& want_l = g["losses"][m];
      EXPECT_NEAR(losses[m].load_balancing, want_l["load_balancing"].get<double>(), 1e-5) << "micro-batch " << m;
      EXPECT_NEAR(losses[m].seq_load_balancing, want_l["seq_load_balancing"].get<double>(), 1e-5) << m;
      EXPECT_NEAR(losses[m].global_load_balancing, want_l["global_load_balancing"].get<double>(), 1e-5) << m;
      EXPECT_NEAR(losses[m].z, want_l["z"].get<double>(), 1e-5 * want_l["z"].get<double>()) << m;
    }
  }
  // The two modes differ on these masks (the per-token one weighs the micro-batches by their tokens).
  const std::vector<double> a = g["dW_per_token"].get<std::vector<double>>(), b = g["dW_default"].get<std::vector<double>>();
  double diff = 0.0;
  for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, std::fabs(a[i] - b[i]));
  EXPECT_GT(diff, 1e-2);
}

// --recompute-modules moe under global_aux_loss: the rerun takes the n̄ its forward used and leaves
// the step's counts alone; its gradient is its forward's, bit for bit, in both modes. A rerun that
// counted again would use n̄ of one more micro-batch (and move the state): the check below sees it.
TEST(MoeRouterPerToken, GlobalAuxLossRerunWithItsForwardsCountsIsBitIdentical) {
  const nlohmann::json g = golden();
  ModelConfig c = config_of(g);
  c.moe.aux_loss_coeff = c.moe.seq_aux_loss_coeff = 0.0;
  const int64_t B = g["B"], T = static_cast<int64_t>(g["S"]) * B, k = c.moe.topk, E = c.moe.num_experts;
  for (const bool per_token : {true, false}) {
    SCOPED_TRACE(per_token ? "per_token" : "default");
    Router r(c);
    const std::vector<float> W = testing::json_floats(g["W"]);
    std::copy(W.begin(), W.end(), r.pb.param_data(r.w.weight));
    Tensor dprobs = Tensor::empty({T, k});
    testing::fill_random(dprobs.data<float>(), dprobs.numel(), 3);
    MoeRouterKey key;
    key.per_token_loss = per_token;
    for (int64_t m = 0; m < 2; ++m) {  // the second micro-batch: n̄ averages two counts
      const std::vector<float> x = testing::json_floats(g["x"][m]);
      Tensor xt = Tensor::empty({T, c.hidden});
      std::copy(x.begin(), x.end(), xt.data<float>());
      MoeRouterSaved forward;
      MoeAuxLosses l;
      moe_router_forward(r.c, r.ops, r.pb, r.w, xt, B, &forward, &l, nullptr, key);
      std::vector<double> nbar;
      for (const MoeRouterSaved::AuxTerm& term : forward.aux)
        if (term.kind == kMoeGlobalAux) nbar = term.counts;
      ASSERT_EQ(static_cast<int64_t>(nbar.size()), E);
      const std::vector<double> counts_after = r.global.counts;
      r.pb.zero_grads();
      const Tensor dx = moe_router_backward(r.c, r.ops, r.pb, r.w, forward, xt, dprobs, 0.5);
      const std::vector<float> dw(r.pb.grad_data(r.w.weight), r.pb.grad_data(r.w.weight) + E * c.hidden);
      MoeRouterKey rerun_key = key;
      rerun_key.global_aux_counts = &nbar;
      MoeRouterSaved rerun;
      moe_router_forward(r.c, r.ops, r.pb, r.w, xt, B, &rerun, nullptr, nullptr, rerun_key);
      EXPECT_EQ(r.global.counts, counts_after) << "the rerun moved the step's counts";
      EXPECT_EQ(r.global.micro_batches, m + 1);
      r.pb.zero_grads();
      const Tensor dx2 = moe_router_backward(r.c, r.ops, r.pb, r.w, rerun, xt, dprobs, 0.5);
      EXPECT_EQ(std::memcmp(dx.data<float>(), dx2.data<float>(), sizeof(float) * T * c.hidden), 0) << "dx";
      EXPECT_EQ(std::memcmp(dw.data(), r.pb.grad_data(r.w.weight), sizeof(float) * E * c.hidden), 0) << "dW";
    }
  }
}

}  // namespace
}  // namespace gale
