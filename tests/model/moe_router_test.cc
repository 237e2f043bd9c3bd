// The MoE router: float64 PyTorch golden values (tools/reference/moe_router_reference.py), group-limited
// top-k, capacity and token dropping rules, sinkhorn routing, the expert-bias update, the input jitter's noise.
#include "model/moe_router.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/param_builders.h"
#include "testing.h"
#include "testing_json.h"

namespace gale {
namespace {

struct RouterFixture {
  ModelConfig c;
  OpTable ops = reference_ops();
  ParamBuffer pb;
  MoeRouterIds w;
  Tensor x;

  RouterFixture(const ModelConfig& config, int64_t T) : c(config) {
    w.weight = pb.add(make_param_spec("router.weight", {c.moe.num_experts, c.hidden}, InitKind::kNormal, 0.5f, true));
    if (c.moe.expert_bias) {
      ParamSpec b = make_param_spec("router.expert_bias", {c.moe.num_experts}, InitKind::kZeros, 0, false);
      b.trainable = false;
      b.buffer = true;
      w.expert_bias = pb.add(b);
    }
    pb.finalize();
    pb.initialize(7);
    x = Tensor::empty({T, c.hidden});
    testing::fill_random(x.data<float>(), x.numel(), 8);
  }
};

ModelConfig router_config(int64_t H, int64_t E, int64_t k) {
  ModelConfig c;
  c.num_layers = 1;
  c.hidden = H;
  c.moe.num_experts = E;
  c.moe.topk = k;
  return c;
}

// Every case of the golden file: the chosen experts (-1: dropped), the weights of the kept pairs,
// the aux and z losses, and the gradients of Σ_kept R·w + coeffs·losses for x and the router weight.
TEST(MoeRouterGolden, MatchesTheFloat64Reference) {
  std::ifstream in(std::string(GALE_TEST_DATA_DIR) + "/reference/moe_router/golden.json");
  ASSERT_TRUE(in.good());
  const nlohmann::json golden = nlohmann::json::parse(in);
  ASSERT_EQ(golden["cases"].size(), 7u);
  for (const auto& g : golden["cases"]) {
    SCOPED_TRACE(g["name"].get<std::string>());
    const int64_t T = g["T"], B = g["B"], H = g["H"], E = g["E"], k = g["k"];
    ModelConfig c = router_config(H, E, k);
    c.moe.sigmoid = g["score"] == "sigmoid";
    c.moe.pre_softmax = g["pre_softmax"];
    c.moe.expert_bias = !g["bias"].empty();
    if (!g["groups"].is_null()) {
      c.moe.num_groups = g["groups"];
      c.moe.group_topk = g["group_topk"];
    }
    if (!g["scaling"].is_null()) c.moe.topk_scaling_factor = g["scaling"];
    const bool seq_aux = g["lb"] == "seq_aux_loss";
    c.moe.sinkhorn = g["lb"] == "sinkhorn";
    (seq_aux ? c.moe.seq_aux_loss_coeff : c.moe.aux_loss_coeff) = g["aux_coeff"];
    c.moe.z_loss_coeff = g["z_coeff"];
    if (!g["capacity"].is_null()) c.moe.capacity_factor = g["capacity"];
    c.moe.drop_by_position = g["policy"] == "position";
    RouterFixture f(c, T);
    const std::vector<float> x = testing::json_floats(g["x"]), W = testing::json_floats(g["W"]), R = testing::json_floats(g["R"]);
    std::copy(x.begin(), x.end(), f.x.data<float>());
    std::copy(W.begin(), W.end(), f.pb.param_data(f.w.weight));
    if (c.moe.expert_bias) {
      const std::vector<float> b = testing::json_floats(g["bias"]);
      std::copy(b.begin(), b.end(), f.pb.param_data(f.w.expert_bias));
    }
    MoeRouterSaved saved;
    MoeAuxLosses losses;
    const MoeRouting r = moe_router_forward(c, f.ops, f.pb, f.w, f.x, B, &saved, &losses);
    const std::vector<int> experts = g["experts"].get<std::vector<int>>();
    const std::vector<double> probs = g["probs"].get<std::vector<double>>();
    Tensor dprobs = Tensor::zeros({T, k});
    for (int64_t i = 0; i < T * k; ++i) {
      ASSERT_EQ(r.experts[i], experts[i]) << "slot " << i;
      if (experts[i] < 0) continue;
      EXPECT_NEAR(r.probs.data<float>()[i], probs[i], 1e-5 * (1.0 + std::fabs(probs[i]))) << "weight " << i;
      dprobs.data<float>()[i] = R[i];
    }
    if (c.moe.any_aux_loss()) {
      EXPECT_NEAR(seq_aux ? losses.seq_load_balancing : losses.load_balancing, g["aux"].get<double>(),
                  1e-5 * g["aux"].get<double>());
      EXPECT_EQ(seq_aux ? losses.load_balancing : losses.seq_load_balancing, 0.0);
    }
    if (c.moe.z_loss_coeff > 0.0) {
      EXPECT_NEAR(losses.z, g["z"].get<double>(), 1e-5 * g["z"].get<double>());
    }
    f.pb.zero_grads();
    const Tensor dx = moe_router_backward(c, f.ops, f.pb, f.w, saved, f.x, dprobs, 1.0);
    const std::vector<double> want_dx = g["dx"].get<std::vector<double>>(), want_dw = g["dW"].get<std::vector<double>>();
    for (int64_t i = 0; i < T * H; ++i) EXPECT_NEAR(dx.data<float>()[i], want_dx[i], 2e-5) << "dx " << i;
    for (int64_t i = 0; i < E * H; ++i) EXPECT_NEAR(f.pb.grad_data(f.w.weight)[i], want_dw[i], 2e-5) << "dW " << i;
  }
}

// Group-limited routing: a group's score is the sum of its top k/group_topk values, not its best one.
TEST(MoeRouter, GroupLimitedTopKScoresGroupsByTheSumOfTheirTopValues) {
  // E = 8 in 4 groups of 2; k = 4 with 2 groups -> each group scored by its 2 best values.
  //                group 0     group 1     group 2     group 3
  const float v[8] = {0.95f, 0.0f, 0.5f, 0.49f, 0.6f, 0.45f, 0.1f, 0.2f};
  int32_t out[4];
  moe_top_k(v, 8, 4, 4, 2, out);  // group sums 0.95, 0.99, 1.05, 0.3: groups 2 and 1
  EXPECT_EQ(std::vector<int32_t>(out, out + 4), (std::vector<int32_t>{4, 2, 3, 5}));
  moe_top_k(v, 8, 4, 0, 0, out);  // plain top-4
  EXPECT_EQ(std::vector<int32_t>(out, out + 4), (std::vector<int32_t>{0, 4, 2, 3}));
  // k = 2, 2 groups: one value per group -> the groups of 0.95 and 0.6.
  moe_top_k(v, 8, 2, 4, 2, out);
  EXPECT_EQ(std::vector<int32_t>(out, out + 2), (std::vector<int32_t>{0, 4}));
  // k = 2, one group: the best group by its top 2 (group 2), both its experts.
  moe_top_k(v, 8, 2, 4, 1, out);
  EXPECT_EQ(std::vector<int32_t>(out, out + 2), (std::vector<int32_t>{4, 5}));
}

TEST(MoeRouter, ExpertCapacityIsTheCeilingOfTokensTimesTopKOverExpertsTimesTheFactor) {
  EXPECT_EQ(moe_expert_capacity(10, 2, 4, 1.0), 5);
  EXPECT_EQ(moe_expert_capacity(6, 2, 4, 0.5), 2);   // 1.5 -> 2
  EXPECT_EQ(moe_expert_capacity(7, 2, 4, 1.1), 4);   // 3.85 -> 4
  EXPECT_EQ(moe_expert_capacity(8, 1, 4, 1.25), 3);  // 2.5 -> 3
  EXPECT_EQ(moe_expert_capacity(16, 2, 8, 1.0), 4);  // exact: no rounding up
}

// Sinkhorn's balanced logits: rows sum to 1/T and columns to 1/E (to its tolerance), and each row
// keeps the order of exp(l) scaled by the column factors.
TEST(MoeSinkhorn, BalancesRowsToOneOverTAndColumnsToOneOverE) {
  const int64_t T = 24, E = 6;
  std::vector<float> logits(T * E), out(T * E);
  testing::fill_random(logits.data(), T * E, 11);
  for (int64_t e = 0; e < E; ++e) logits[e] += 3.0f;  // a skewed first token
  moe_sinkhorn(logits.data(), T, E, out.data());
  for (int64_t t = 0; t < T; ++t) {
    double row = 0.0;
    for (int64_t e = 0; e < E; ++e) row += out[t * E + e];
    EXPECT_NEAR(row, 1.0 / T, 1e-6) << "row " << t;
  }
  for (int64_t e = 0; e < E; ++e) {
    double col = 0.0;
    for (int64_t t = 0; t < T; ++t) col += out[t * E + e];
    EXPECT_NEAR(col, 1.0 / E, 1e-3 / E) << "column " << e;
  }
}

// Every token's logits prefer expert 0. Evaluation routes all of them there (the top-1 of the
// scores); training routes by the balanced logits, which spread the tokens over the experts; the
// weight is the sigmoid score (top-1) of the chosen expert either way.
TEST(MoeRouterSinkhorn, TrainingBalancesTheChoiceEvaluationTakesTheScores) {
  ModelConfig c = router_config(4, 4, 1);
  c.moe.sinkhorn = true;
  const int64_t T = 8;
  RouterFixture f(c, T);
  float* W = f.pb.param_data(f.w.weight);
  for (int64_t i = 0; i < 16; ++i) W[i] = 0.0f;
  for (int64_t e = 0; e < 4; ++e) W[e * 4 + e] = 1.0f;  // logit e = x_t,e
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < 4; ++h) f.x.data<float>()[t * 4 + h] = h == 0 ? 2.0f : 0.1f * static_cast<float>((t + h) % 4);
  const MoeRouting eval = moe_router_forward(c, f.ops, f.pb, f.w, f.x, 1, nullptr, nullptr, nullptr, {0, nullptr, false});
  EXPECT_EQ(eval.tokens_per_expert, (std::vector<int64_t>{8, 0, 0, 0}));
  const MoeRouting train = moe_router_forward(c, f.ops, f.pb, f.w, f.x, 1, nullptr, nullptr);
  EXPECT_LT(train.tokens_per_expert[0], 4);  // balancing moved most tokens elsewhere
  int64_t used = 0;
  for (int64_t e = 0; e < 4; ++e) used += train.tokens_per_expert[e] > 0;
  EXPECT_GE(used, 3);
  std::vector<float> balanced(T * 4);
  moe_sinkhorn(f.x.data<float>(), T, 4, balanced.data());  // the logits equal x here
  for (int64_t t = 0; t < T; ++t) {
    EXPECT_EQ(train.experts[t], std::max_element(&balanced[t * 4], &balanced[t * 4] + 4) - &balanced[t * 4]) << t;
    const float l = f.x.data<float>()[t * 4 + train.experts[t]];
    EXPECT_NEAR(train.probs.data<float>()[t], 1.0 / (1.0 + std::exp(-l)), 1e-6) << "token " << t;
  }
}

// Every token prefers expert 0 (top-1, pre-softmax weights): with capacity C the policies keep
// the C largest weights or the C earliest tokens; the other experts' pairs are untouched.
TEST(MoeRouter, TokenDroppingKeepsTheLargestWeightsOrTheEarliestTokens) {
  ModelConfig c = router_config(4, 4, 1);
  c.moe.pre_softmax = true;
  c.moe.capacity_factor = 1.0;  // C = ceil(8·1/4·1) = 2
  const int64_t T = 8;
  RouterFixture f(c, T);
  float* W = f.pb.param_data(f.w.weight);
  for (int64_t i = 0; i < 16; ++i) W[i] = 0.0f;
  W[0] = 1.0f;  // logit of expert 0 = x_t,0; the others 0
  const float x0[T] = {3.0f, 1.0f, 4.0f, 1.5f, 5.0f, 2.0f, 0.5f, 2.5f};
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < 4; ++h) f.x.data<float>()[t * 4 + h] = h == 0 ? x0[t] : 0.0f;
  }
  for (bool position : {false, true}) {
    c.moe.drop_by_position = position;
    const MoeRouting r = moe_router_forward(c, f.ops, f.pb, f.w, f.x, 1, nullptr, nullptr);
    const std::vector<int32_t> want = position ? std::vector<int32_t>{0, 0, -1, -1, -1, -1, -1, -1}
                                               : std::vector<int32_t>{-1, -1, 0, -1, 0, -1, -1, -1};
    EXPECT_EQ(r.experts, want) << (position ? "position" : "probs");
    EXPECT_EQ(r.tokens_per_expert, (std::vector<int64_t>{2, 0, 0, 0}));
  }
  c.moe.capacity_factor = 4.5;  // C = 9 > T: nothing dropped
  const MoeRouting all = moe_router_forward(c, f.ops, f.pb, f.w, f.x, 1, nullptr, nullptr);
  EXPECT_EQ(all.tokens_per_expert, (std::vector<int64_t>{8, 0, 0, 0}));
}

// --moe-pad-expert-input-to-capacity: every expert gets min(C, T) rows, the missing ones the earliest
// tokens that did not choose it; they count for the expert bias (Megatron's routing map).
TEST(MoeRouter, PaddingFillsEveryExpertToItsCapacity) {
  ModelConfig c = router_config(4, 4, 1);
  c.moe.pre_softmax = true;
  c.moe.capacity_factor = 1.0;  // C = 2
  c.moe.pad_to_capacity = true;
  const int64_t T = 8;
  RouterFixture f(c, T);
  float* W = f.pb.param_data(f.w.weight);
  for (int64_t i = 0; i < 16; ++i) W[i] = 0.0f;
  W[0] = 1.0f;
  W[4 * 3] = -1.0f;  // expert 3: logit -x_t,0 (token 6 chooses it: x < 0)
  const float x0[T] = {3.0f, 1.0f, 4.0f, 1.5f, 5.0f, 2.0f, -0.5f, 2.5f};
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < 4; ++h) f.x.data<float>()[t * 4 + h] = h == 0 ? x0[t] : 0.0f;
  const MoeRouting r = moe_router_forward(c, f.ops, f.pb, f.w, f.x, 1, nullptr, nullptr);
  EXPECT_EQ(r.experts, (std::vector<int32_t>{-1, -1, 0, -1, 0, -1, 3, -1}));
  EXPECT_EQ(r.tokens_per_expert, (std::vector<int64_t>{2, 2, 2, 2}));
  ASSERT_EQ(r.padding.size(), 4u);
  EXPECT_TRUE(r.padding[0].empty());
  EXPECT_EQ(r.padding[1], (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(r.padding[3], (std::vector<int64_t>{0}));  // token 6 is its own
  c.moe.capacity_factor = 4.5;  // C = 9 > T: every expert gets all 8 tokens
  const MoeRouting all = moe_router_forward(c, f.ops, f.pb, f.w, f.x, 1, nullptr, nullptr);
  EXPECT_EQ(all.tokens_per_expert, (std::vector<int64_t>{8, 8, 8, 8}));
  EXPECT_EQ(all.padding[0], (std::vector<int64_t>{6}));
}

// --fix-router (MindSpeed's): pair j of row t goes to expert (t·k + j) mod E, every expert gets T·k/E
// pairs, and the weights and the gradients for x and the router weight are those of the real choice.
TEST(MoeRouter, FixRouterSendsPairsRoundRobinWithTheRealWeightsAndGradients) {
  const int64_t T = 6, E = 4, k = 2;
  ModelConfig c = router_config(5, E, k);
  RouterFixture f(c, T);
  Tensor dprobs = Tensor::empty({T, k});
  testing::fill_random(dprobs.data<float>(), dprobs.numel(), 9);
  auto run = [&](bool fix, std::vector<float>* dw, std::vector<float>* dx) {
    c.moe.fix_router = fix;
    MoeRouterSaved saved;
    MoeAuxLosses losses;
    MoeRouting r = moe_router_forward(c, f.ops, f.pb, f.w, f.x, 1, &saved, &losses);
    f.pb.zero_grads();
    const Tensor g = moe_router_backward(c, f.ops, f.pb, f.w, saved, f.x, dprobs, 1.0);
    dw->assign(f.pb.grad_data(f.w.weight), f.pb.grad_data(f.w.weight) + E * 5);
    dx->assign(g.data<float>(), g.data<float>() + g.numel());
    return r;
  };
  std::vector<float> dw_real, dx_real, dw_fixed, dx_fixed;
  const MoeRouting real = run(false, &dw_real, &dx_real);
  const MoeRouting fixed = run(true, &dw_fixed, &dx_fixed);
  for (int64_t i = 0; i < T * k; ++i) EXPECT_EQ(fixed.experts[i], i % E) << i;
  EXPECT_EQ(fixed.tokens_per_expert, (std::vector<int64_t>{3, 3, 3, 3}));
  EXPECT_NE(real.experts, fixed.experts);  // the fixture's real choice is not the round robin
  for (int64_t i = 0; i < T * k; ++i) EXPECT_EQ(fixed.probs.data<float>()[i], real.probs.data<float>()[i]) << i;
  EXPECT_EQ(dw_fixed, dw_real);
  EXPECT_EQ(dx_fixed, dx_real);
}

// Megatron's update: bias += rate · sign(mean − count), per expert.
TEST(MoeRouter, ExpertBiasMovesTowardsTheMeanCount) {
  float bias[4] = {0.5f, 0.5f, 0.5f, -0.25f};
  const double counts[4] = {1, 5, 3, 3};  // mean 3
  update_expert_bias(bias, counts, 4, 0.125);
  EXPECT_EQ(bias[0], 0.625f);   // underloaded: up
  EXPECT_EQ(bias[1], 0.375f);   // overloaded: down
  EXPECT_EQ(bias[2], 0.5f);     // at the mean: unchanged
  EXPECT_EQ(bias[3], -0.25f);
}

// The expert bias only steers the choice: the weights stay the selected sigmoid scores,
// normalised and scaled.
TEST(MoeRouter, SigmoidWeightsAreTheSelectedScoresNormalisedAndScaled) {
  ModelConfig c = router_config(5, 6, 2);
  c.moe.sigmoid = true;
  c.moe.expert_bias = true;
  c.moe.topk_scaling_factor = 2.5;
  RouterFixture f(c, 9);
  float* bias = f.pb.param_data(f.w.expert_bias);
  for (int64_t e = 0; e < 6; ++e) bias[e] = e == 5 ? 10.0f : 0.0f;  // expert 5 always chosen first
  const MoeRouting r = moe_router_forward(c, f.ops, f.pb, f.w, f.x, 1, nullptr, nullptr);
  for (int64_t t = 0; t < 9; ++t) {
    std::vector<double> s(6);
    for (int64_t e = 0; e < 6; ++e) {
      double l = 0.0;
      for (int64_t h = 0; h < 5; ++h) l += static_cast<double>(f.x.data<float>()[t * 5 + h]) * f.pb.param_data(f.w.weight)[e * 5 + h];
      s[e] = 1.0 / (1.0 + std::exp(-l));
    }
    ASSERT_EQ(r.experts[t * 2], 5);
    const int32_t second = r.experts[t * 2 + 1];
    for (int64_t e = 0; e < 5; ++e) EXPECT_LE(s[e], s[second]);
    EXPECT_NEAR(r.probs.data<float>()[t * 2], 2.5 * s[5] / (s[5] + s[second]), 1e-5);
    EXPECT_NEAR(r.probs.data<float>()[t * 2 + 1], 2.5 * s[second] / (s[5] + s[second]), 1e-5);
  }
}

// --moe-input-jitter-eps: the noise lies in [1 - eps, 1 + eps], covers it (about uniformly: mean 1),
// is a pure function of (seed, layer, token id, column), differs between layers, tokens and columns,
// and is exactly 1 without jitter.
TEST(MoeRouter, InputJitterNoiseIsUniformWithinItsBounds) {
  ModelConfig c;
  c.hidden = 16;
  EXPECT_EQ(moe_input_jitter(c, 0, 5, 3), 1.0f);  // eps 0: none
  c.moe.input_jitter_eps = 0.1;
  const float lo = static_cast<float>(1.0 - 0.1), hi = static_cast<float>(1.0 + 0.1);
  float mn = 2.0f, mx = 0.0f;
  double sum = 0.0;
  int64_t n = 0, same_as_layer0 = 0;
  for (int64_t id = 0; id < 500; ++id)
    for (int64_t h = 0; h < c.hidden; ++h) {
      const float v = moe_input_jitter(c, 3, 1000 * id + 7, h);
      EXPECT_GE(v, lo);
      EXPECT_LE(v, hi);
      mn = std::min(mn, v);
      mx = std::max(mx, v);
      sum += v;
      ++n;
      same_as_layer0 += v == moe_input_jitter(c, 0, 1000 * id + 7, h);
      ASSERT_EQ(v, moe_input_jitter(c, 3, 1000 * id + 7, h));  // a pure function
    }
  EXPECT_LT(mn, lo + 0.002f);
  EXPECT_GT(mx, hi - 0.002f);
  EXPECT_NEAR(sum / static_cast<double>(n), 1.0, 0.002);  // σ of the mean: 0.1/√3/√8000 ≈ 0.0006
  EXPECT_LT(same_as_layer0, 10);
  EXPECT_NE(moe_input_jitter(c, 3, 7, 0), moe_input_jitter(c, 3, 8, 0));
  EXPECT_NE(moe_input_jitter(c, 3, 7, 0), moe_input_jitter(c, 3, 7, 1));
  ModelConfig other = c;  // another --seed, other noise
  other.seed = c.seed + 1;
  EXPECT_NE(moe_input_jitter(c, 3, 7, 0), moe_input_jitter(other, 3, 7, 0));
}

// --moe-router-load-balancing-type global_aux_loss on one rank: the step's first micro-batch is
// aux_loss exactly; the second uses the two micro-batches' mean token counts n̄ = (n¹ + n²)/2 in
// coeff·E/(T²k)·Σ_e P_e·n̄_e (P_e = Σ_t softmax(x·Wᵀ)_te, computed here in double), and its router
// gradient is that expression's, checked by central differences with n̄ held (the counts carry no
// gradient); reset() starts the next step afresh.
TEST(MoeRouterGlobalAux, AveragesTheStepsTokenCountsOverItsMicroBatches) {
  const int64_t T = 10, H = 8, E = 6, k = 2;
  ModelConfig aux = router_config(H, E, k);
  aux.moe.aux_loss_coeff = 0.01;
  ModelConfig global = aux;
  global.moe.global_aux_loss_coeff = 0.01;
  global.moe.aux_loss_coeff = 0.0;
  RouterFixture fa(aux, T), fg(global, T);
  MoeGlobalAux state(E, nullptr);
  fg.w.global_aux = &state;
  Tensor x2 = Tensor::empty({T, H});
  testing::fill_random(x2.data<float>(), x2.numel(), 9);
  Tensor none = Tensor::zeros({T, k});

  // micro-batch 1: identical to aux_loss, loss and gradients
  MoeRouterSaved sa, sg;
  MoeAuxLosses la, lg;
  moe_router_forward(aux, fa.ops, fa.pb, fa.w, fa.x, 1, &sa, &la);
  moe_router_forward(global, fg.ops, fg.pb, fg.w, fg.x, 1, &sg, &lg);
  EXPECT_EQ(lg.global_load_balancing, la.load_balancing);
  const std::vector<double> n1 = sa.aux.at(0).counts;
  fa.pb.zero_grads();
  fg.pb.zero_grads();
  const Tensor dxa = moe_router_backward(aux, fa.ops, fa.pb, fa.w, sa, fa.x, none, 1.0);
  const Tensor dxg = moe_router_backward(global, fg.ops, fg.pb, fg.w, sg, fg.x, none, 1.0);
  for (int64_t i = 0; i < T * H; ++i) EXPECT_EQ(dxg.data<float>()[i], dxa.data<float>()[i]) << "dx " << i;
  EXPECT_EQ(state.micro_batches, 1);

  // micro-batch 2: the mean counts
  MoeRouterSaved sa2, sg2;
  moe_router_forward(aux, fa.ops, fa.pb, fa.w, x2, 1, &sa2, &la);
  moe_router_forward(global, fg.ops, fg.pb, fg.w, x2, 1, &sg2, &lg);
  const std::vector<double> n2 = sa2.aux.at(0).counts;
  std::vector<double> mean(E);
  for (int64_t e = 0; e < E; ++e) {
    mean[e] = (n1[e] + n2[e]) / 2.0;
    EXPECT_EQ(state.counts[e], n1[e] + n2[e]) << "expert " << e;
  }
  EXPECT_EQ(state.micro_batches, 2);
  EXPECT_NE(mean, n2);  // the case exercises the average
  const float* W = fg.pb.param_data(fg.w.weight);
  auto loss = [&](const std::vector<double>& w) {  // coeff·E/(T²k)·Σ_e P_e·n̄_e in double
    double sum = 0.0;
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> l(E);
      double mx = -1e300, z = 0.0;
      for (int64_t e = 0; e < E; ++e) {
        l[e] = 0.0;
        for (int64_t h = 0; h < H; ++h) l[e] += static_cast<double>(x2.data<float>()[t * H + h]) * w[e * H + h];
        mx = std::max(mx, l[e]);
      }
      for (int64_t e = 0; e < E; ++e) z += std::exp(l[e] - mx);
      for (int64_t e = 0; e < E; ++e) sum += std::exp(l[e] - mx) / z * mean[e];
    }
    return static_cast<double>(E) / (static_cast<double>(T * T) * k) * sum;
  };
  std::vector<double> w(W, W + E * H);
  EXPECT_NEAR(lg.global_load_balancing, loss(w), 1e-6 * loss(w));
  fg.pb.zero_grads();
  moe_router_backward(global, fg.ops, fg.pb, fg.w, sg2, x2, none, 1.0);
  for (int64_t i = 0; i < E * H; ++i) {
    std::vector<double> up = w, down = w;
    up[i] += 1e-4;
    down[i] -= 1e-4;
    const double fd = 0.01 * (loss(up) - loss(down)) / 2e-4;
    EXPECT_NEAR(fg.pb.grad_data(fg.w.weight)[i], fd, 1e-6 + 1e-3 * std::fabs(fd)) << "dW " << i;
  }

  // the next step: afresh
  state.reset();
  MoeRouterSaved sg3;
  moe_router_forward(global, fg.ops, fg.pb, fg.w, fg.x, 1, &sg3, &lg);
  moe_router_forward(aux, fa.ops, fa.pb, fa.w, fa.x, 1, &sa, &la);
  EXPECT_EQ(lg.global_load_balancing, la.load_balancing);
  EXPECT_EQ(state.micro_batches, 1);
}

// Megatron's list form, --moe-router-load-balancing-type aux_loss seq_aux_loss global_aux_loss with
// one coefficient each: each loss equals its single-type run's bit for bit, and the router's
// gradients are the sum of the single runs' (the routing itself does not change).
TEST(MoeRouterLoadBalancingList, LossesAndGradientsAreTheSumOfTheSingleTypes) {
  const int64_t T = 12, B = 3, H = 8, E = 6, k = 2;
  for (bool sigmoid : {false, true}) {
    SCOPED_TRACE(sigmoid ? "sigmoid" : "softmax");
    ModelConfig base = router_config(H, E, k);
    base.moe.sigmoid = sigmoid;
    ModelConfig one[kMoeAuxKinds] = {base, base, base}, all = base;
    const double coeffs[kMoeAuxKinds] = {0.3, 0.7, 0.2};
    for (int kind = 0; kind < kMoeAuxKinds; ++kind) {
      double* single[kMoeAuxKinds] = {&one[kind].moe.aux_loss_coeff, &one[kind].moe.seq_aux_loss_coeff,
                                      &one[kind].moe.global_aux_loss_coeff};
      double* both[kMoeAuxKinds] = {&all.moe.aux_loss_coeff, &all.moe.seq_aux_loss_coeff, &all.moe.global_aux_loss_coeff};
      *single[kind] = coeffs[kind];
      *both[kind] = coeffs[kind];
    }
    auto run = [&](const ModelConfig& c, MoeAuxLosses* l, std::vector<float>* dw, std::vector<float>* dx) {
      RouterFixture f(c, T);
      MoeGlobalAux state(E, nullptr);
      f.w.global_aux = &state;
      MoeRouterSaved saved;
      const MoeRouting r = moe_router_forward(c, f.ops, f.pb, f.w, f.x, B, &saved, l);
      Tensor dprobs = Tensor::zeros({T, k});  // only the auxiliary losses' gradients
      f.pb.zero_grads();
      const Tensor g = moe_router_backward(c, f.ops, f.pb, f.w, saved, f.x, dprobs, 1.0);
      dw->assign(f.pb.grad_data(f.w.weight), f.pb.grad_data(f.w.weight) + E * H);
      dx->assign(g.data<float>(), g.data<float>() + T * H);
      return r.experts;
    };
    MoeAuxLosses la;
    std::vector<float> dw_all, dx_all;
    const std::vector<int32_t> experts = run(all, &la, &dw_all, &dx_all);
    std::vector<double> dw_sum(E * H, 0.0), dx_sum(T * H, 0.0);
    for (int kind = 0; kind < kMoeAuxKinds; ++kind) {
      MoeAuxLosses l;
      std::vector<float> dw, dx;
      EXPECT_EQ(run(one[kind], &l, &dw, &dx), experts);
      EXPECT_GT(l.balancing(kind), 0.0);
      EXPECT_EQ(la.balancing(kind), l.balancing(kind)) << kMoeAuxTypes[kind];
      for (int other = 0; other < kMoeAuxKinds; ++other)
        if (other != kind) EXPECT_EQ(l.balancing(other), 0.0);
      for (int64_t i = 0; i < E * H; ++i) dw_sum[i] += dw[i];
      for (int64_t i = 0; i < T * H; ++i) dx_sum[i] += dx[i];
    }
    EXPECT_NE(la.load_balancing, la.seq_load_balancing);
    for (int64_t i = 0; i < E * H; ++i) EXPECT_NEAR(dw_all[i], dw_sum[i], 1e-6 + 1e-5 * std::fabs(dw_sum[i])) << "dW " << i;
    for (int64_t i = 0; i < T * H; ++i) EXPECT_NEAR(dx_all[i], dx_sum[i], 1e-6 + 1e-5 * std::fabs(dx_sum[i])) << "dx " << i;
  }
}

// --moe-router-force-load-balancing: the logits are moe_random_logit(layer, token id, e) ~ N(0, 1),
// whatever the router weight; the choice and weights follow from them; backward is straight-through
// (dW = dlᵀ·x and dx = dl·W for the gradient dl of the random logits).
TEST(MoeRouterForceLoadBalancing, RandomLogitsWithAStraightThroughGradient) {
  const int64_t T = 9, H = 8, E = 6, k = 2;
  ModelConfig c = router_config(H, E, k);
  c.moe.force_load_balancing = true;
  c.seed = 5;
  double mean = 0.0, square = 0.0;
  const int64_t n = 20000;
  for (int64_t i = 0; i < n; ++i) {
    const double v = moe_random_logit(c, 1, i / E, i % E);
    mean += v / n;
    square += v * v / n;
  }
  EXPECT_NEAR(mean, 0.0, 0.03);
  EXPECT_NEAR(square, 1.0, 0.05);
  EXPECT_EQ(moe_random_logit(c, 1, 4, 2), moe_random_logit(c, 1, 4, 2));
  EXPECT_NE(moe_random_logit(c, 1, 4, 2), moe_random_logit(c, 2, 4, 2));
  ModelConfig other_seed = c;
  other_seed.seed = 6;
  EXPECT_NE(moe_random_logit(c, 1, 4, 2), moe_random_logit(other_seed, 1, 4, 2));

  std::vector<int64_t> ids(T);
  for (int64_t t = 0; t < T; ++t) ids[t] = 100 + 3 * t;
  const MoeRouterKey key{3, ids.data(), true};
  RouterFixture f(c, T), g(c, T);
  for (int64_t i = 0; i < E * H; ++i) g.pb.param_data(g.w.weight)[i] *= -2.0f;  // another router weight
  MoeRouterSaved sf, sg;
  MoeAuxLosses lf, lg;
  const MoeRouting rf = moe_router_forward(c, f.ops, f.pb, f.w, f.x, 1, &sf, &lf, nullptr, key);
  const MoeRouting rg = moe_router_forward(c, g.ops, g.pb, g.w, g.x, 1, &sg, &lg, nullptr, key);
  EXPECT_EQ(rf.experts, rg.experts);
  for (int64_t i = 0; i < T * k; ++i) EXPECT_EQ(rf.probs.data<float>()[i], rg.probs.data<float>()[i]);
  std::vector<double> q(T * k);  // the default routing on the random logits: softmax over the top-k
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> l(E);
    for (int64_t e = 0; e < E; ++e) l[e] = moe_random_logit(c, 3, ids[t], e);
    int32_t top[2];
    moe_top_k(l.data(), E, k, 0, 0, top);
    const double z = std::exp(double{l[top[0]]}) + std::exp(double{l[top[1]]});
    for (int64_t j = 0; j < k; ++j) {
      EXPECT_EQ(rf.experts[t * k + j], top[j]) << "token " << t;
      q[t * k + j] = std::exp(double{l[top[j]]}) / z;
      EXPECT_NEAR(rf.probs.data<float>()[t * k + j], q[t * k + j], 1e-6);
    }
  }
  Tensor dprobs = Tensor::empty({T, k});
  testing::fill_random(dprobs.data<float>(), dprobs.numel(), 11);
  f.pb.zero_grads();
  const Tensor dx = moe_router_backward(c, f.ops, f.pb, f.w, sf, f.x, dprobs, 1.0);
  std::vector<double> dl(T * E, 0.0);  // ∂/∂l of Σ R·q through q = softmax over the selected logits
  for (int64_t t = 0; t < T; ++t) {
    double qg = 0.0;
    for (int64_t j = 0; j < k; ++j) qg += q[t * k + j] * dprobs.data<float>()[t * k + j];
    for (int64_t j = 0; j < k; ++j)
      dl[t * E + rf.experts[t * k + j]] = q[t * k + j] * (dprobs.data<float>()[t * k + j] - qg);
  }
  const float* W = f.pb.param_data(f.w.weight);
  for (int64_t e = 0; e < E; ++e)
    for (int64_t h = 0; h < H; ++h) {
      double want = 0.0;
      for (int64_t t = 0; t < T; ++t) want += dl[t * E + e] * f.x.data<float>()[t * H + h];
      EXPECT_NEAR(f.pb.grad_data(f.w.weight)[e * H + h], want, 1e-5) << "dW " << e << "," << h;
    }
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      double want = 0.0;
      for (int64_t e = 0; e < E; ++e) want += dl[t * E + e] * W[e * H + h];
      EXPECT_NEAR(dx.data<float>()[t * H + h], want, 1e-5) << "dx " << t << "," << h;
    }
}

}  // namespace
}  // namespace gale
