// Quantile balancing (Megatron main's qb_dual_update and qb_beta update): float64 numpy golden values
// (tools/reference/quantile_balancing_reference.py), and the router's use of them in training and evaluation.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/moe_router.h"
#include "model/param_builders.h"
#include "testing.h"
#include "testing_json.h"

namespace gale {
namespace {

nlohmann::json golden() {
  std::ifstream in(std::string(GALE_TEST_DATA_DIR) + "/reference/quantile_balancing/golden.json");
  EXPECT_TRUE(in.good());
  return nlohmann::json::parse(in);
}

// Each dual update of the golden file: the chosen experts exactly (the reference keeps every
// token's k-th and (k+1)-th values 1e-5 apart), the column quantile to f32 rounding; without
// beta_local (evaluation) the same choice.
TEST(MoeQuantileBalancingGolden, DualUpdateMatchesTheReference) {
  const nlohmann::json g = golden();
  ASSERT_EQ(g["dual_update"].size(), 4u);
  for (const nlohmann::json& c : g["dual_update"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const int64_t m = c["m"], E = c["E"], k = c["k"];
    const std::vector<float> scores = testing::json_floats(c["scores"]), beta = testing::json_floats(c["beta"]);
    std::vector<int32_t> indices(static_cast<size_t>(m * k)), eval_indices(indices.size());
    std::vector<float> quantile(static_cast<size_t>(E));
    moe_qb_dual_update(scores.data(), m, E, k, beta.data(), indices.data(), quantile.data());
    moe_qb_dual_update(scores.data(), m, E, k, beta.data(), eval_indices.data(), nullptr);
    const std::vector<int64_t> want = c["indices"].get<std::vector<int64_t>>();
    for (int64_t i = 0; i < m * k; ++i) {
      EXPECT_EQ(indices[i], want[i]) << "slot " << i;
      EXPECT_EQ(eval_indices[i], want[i]) << "slot " << i;
    }
    const std::vector<double> q = c["quantile"].get<std::vector<double>>();
    for (int64_t e = 0; e < E; ++e) EXPECT_NEAR(quantile[e], q[e], 2e-6) << "expert " << e;
  }
}

// A few steps of 2 data-parallel ranks x 2 micro-batches: each micro-batch routes with the step's
// beta and adds its quantile; the step's mean over micro-batches and ranks moves beta
// (update_qb_beta: the EMA, then centred), as grad_sync's update does.
TEST(MoeQuantileBalancingGolden, StepUpdatesMatchTheReference) {
  const nlohmann::json g = golden();
  ASSERT_EQ(g["steps"].size(), 2u);
  for (const nlohmann::json& c : g["steps"]) {
    const double ema = c["ema"];
    SCOPED_TRACE(ema);
    const int64_t ranks = c["ranks"], micro = c["micro_batches"], m = c["m"], E = c["E"], k = c["k"];
    std::vector<float> beta(static_cast<size_t>(E), 0.0f);
    for (size_t step = 0; step < c["betas"].size(); ++step) {
      std::vector<double> avg(static_cast<size_t>(E), 0.0);
      for (int64_t r = 0; r < ranks; ++r) {
        std::vector<double> sum(static_cast<size_t>(E), 0.0);
        for (int64_t j = 0; j < micro; ++j) {
          const std::vector<float> s = testing::json_floats(c["logits"][step][static_cast<size_t>(r * micro + j)]);
          std::vector<int32_t> idx(static_cast<size_t>(m * k));
          std::vector<float> q(static_cast<size_t>(E));
          moe_qb_dual_update(s.data(), m, E, k, beta.data(), idx.data(), q.data());
          for (int64_t e = 0; e < E; ++e) sum[e] += q[e];
        }
        for (int64_t e = 0; e < E; ++e) avg[e] += sum[e] / static_cast<double>(micro) / static_cast<double>(ranks);
      }
      update_qb_beta(beta.data(), avg.data(), E, ema);
      const std::vector<double> want = c["betas"][step].get<std::vector<double>>();
      double mean = 0.0;
      for (int64_t e = 0; e < E; ++e) {
        EXPECT_NEAR(beta[e], want[e], 5e-6) << "step " << step << " expert " << e;
        mean += beta[e];
      }
      EXPECT_NEAR(mean, 0.0, 1e-6);
    }
  }
}

// The router with quantile_balancing: the experts are the dual update's (not the plain top-k), the
// weights the score function's at them, and only a training forward that keeps state and reports
// losses adds its quantile to the layer's sums.
struct QbRouter {
  ModelConfig c;
  OpTable ops = reference_ops();
  ParamBuffer pb;
  MoeRouterIds w;
  MoeQuantileBalancing qb;
  Tensor x;
  static constexpr int64_t T = 16, H = 6, E = 4, k = 2;

  explicit QbRouter(bool sigmoid) : qb(E) {
    c.num_layers = 1;
    c.hidden = H;
    c.moe.num_experts = E;
    c.moe.topk = k;
    c.moe.sigmoid = sigmoid;
    c.moe.quantile_balancing = true;
    w.weight = pb.add(make_param_spec("router.weight", {E, H}, InitKind::kNormal, 0.5f, true));
    ParamSpec b = make_param_spec("router.qb_beta", {E}, InitKind::kZeros, 0, false);
    b.trainable = false;
    b.buffer = true;
    w.qb_beta = pb.add(b);
    w.qb = &qb;
    pb.finalize();
    pb.initialize(7);
    const float beta[E] = {0.4f, -0.1f, -0.5f, 0.2f};  // a bias that changes the plain top-k's choice
    std::copy(beta, beta + E, pb.param_data(w.qb_beta));
    x = Tensor::empty({T, H});
    testing::fill_random(x.data<float>(), x.numel(), 8);
  }
  std::vector<float> logits() const {
    std::vector<float> l(static_cast<size_t>(T * E), 0.0f);
    const float* W = pb.param_data(w.weight);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t e = 0; e < E; ++e) {
        double s = 0.0;
        for (int64_t h = 0; h < H; ++h) s += static_cast<double>(x.data<float>()[t * H + h]) * W[e * H + h];
        l[t * E + e] = static_cast<float>(s);
      }
    return l;
  }
};

TEST(MoeQuantileBalancingRouter, ChoosesByTheDualUpdateAndCountsTrainingForwardsOnly) {
  for (bool sigmoid : {false, true}) {
    SCOPED_TRACE(sigmoid ? "sigmoid" : "softmax");
    QbRouter r(sigmoid);
    const int64_t T = QbRouter::T, E = QbRouter::E, k = QbRouter::k;
    const std::vector<float> l = r.logits();
    std::vector<int32_t> want(static_cast<size_t>(T * k));
    std::vector<float> quantile(static_cast<size_t>(E));
    moe_qb_dual_update(l.data(), T, E, k, r.pb.param_data(r.w.qb_beta), want.data(), quantile.data());
    int differs = 0;  // from the plain top-k of the logits (the bias matters)
    for (int64_t t = 0; t < T; ++t) {
      int32_t plain[k];
      moe_top_k(l.data() + t * E, E, k, 0, 0, plain);
      for (int64_t j = 0; j < k; ++j) differs += plain[j] != want[t * k + j];
    }
    EXPECT_GT(differs, 0);

    MoeRouterSaved saved;
    MoeAuxLosses losses;
    const MoeRouting train = moe_router_forward(r.c, r.ops, r.pb, r.w, r.x, 2, &saved, &losses);
    ASSERT_EQ(r.qb.count, 1);
    for (int64_t e = 0; e < E; ++e) EXPECT_NEAR(r.qb.sum[e], quantile[e], 1e-6);
    for (int64_t i = 0; i < T * k; ++i) ASSERT_EQ(train.experts[i], want[i]) << "slot " << i;
    for (int64_t t = 0; t < T; ++t) {  // the weights: the score function's at the chosen experts
      double w[k], sum = 0.0;
      for (int64_t j = 0; j < k; ++j) {
        const double v = l[t * E + want[t * k + j]];
        w[j] = sigmoid ? 1.0 / (1.0 + std::exp(-v)) : std::exp(v);
        sum += w[j];
      }
      for (int64_t j = 0; j < k; ++j)
        EXPECT_NEAR(train.probs.data<float>()[t * k + j], w[j] / sum, 1e-5) << "token " << t << " slot " << j;
    }
    // A rerun without losses (--recompute-modules moe) and an evaluation forward: same choice, no count.
    MoeRouterSaved rerun_saved;
    const MoeRouting rerun = moe_router_forward(r.c, r.ops, r.pb, r.w, r.x, 2, &rerun_saved, nullptr);
    MoeRouterKey eval_key;
    eval_key.training = false;
    const MoeRouting eval = moe_router_forward(r.c, r.ops, r.pb, r.w, r.x, 2, nullptr, nullptr, nullptr, eval_key);
    EXPECT_EQ(rerun.experts, train.experts);
    EXPECT_EQ(eval.experts, train.experts);
    EXPECT_EQ(r.qb.count, 1);
  }
}

}  // namespace
}  // namespace gale
