// GRPO's math against Megatron-LM's own calculate_grpo_advantages / calculate_grpo_loss run in
// float64 (tests/data/reference/grpo/fixture.json, tools/reference/grpo_reference.py), the gradient
// against finite differences through a log-softmax, and the direction of a gradient step.
#include "train/grpo_loss.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

namespace gale {
namespace {

nlohmann::json fixture() {
  std::ifstream in(std::string(GALE_TEST_DATA_DIR) + "/reference/grpo/fixture.json");
  EXPECT_TRUE(in.good()) << "tests/data/reference/grpo/fixture.json";
  return nlohmann::json::parse(in);
}

GrpoLossOptions options_of(const nlohmann::json& c) {
  GrpoLossOptions o;
  o.clamp_eps_lower = c["clamp_eps_lower"];
  o.clamp_eps_upper = c["clamp_eps_upper"];
  o.kl_beta = c["kl_beta"];
  o.entropy_weight = c["entropy_weight"];
  if (!c["is_truncation_coef"].is_null()) o.is_truncation_coef = c["is_truncation_coef"];
  return o;
}

// The case's inference log-probabilities (--rl-inference-logprobs-is-correction), empty for none.
std::vector<double> inference_of(const nlohmann::json& c) {
  return c["inference"].is_null() ? std::vector<double>{} : c["inference"].get<std::vector<double>>();
}

TEST(GrpoAdvantages, MatchMegatron) {
  const nlohmann::json f = fixture();
  ASSERT_GE(f["advantage_cases"].size(), 4u);
  for (const auto& c : f["advantage_cases"]) {
    const std::vector<double> got = grpo_advantages(c["rewards"].get<std::vector<std::vector<double>>>());
    const std::vector<double> want = c["advantages"];
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-12) << i;
  }
}

TEST(GrpoAdvantages, DocumentedExample) {
  // Megatron's docstring: [[-1, 1], [4, 4]] -> about [-1, 1, 0, 0] (the std damped by 1e-4).
  const std::vector<double> a = grpo_advantages({{-1.0, 1.0}, {4.0, 4.0}});
  ASSERT_EQ(a.size(), 4u);
  EXPECT_NEAR(a[0], -1.0 / 1.0001, 1e-12);
  EXPECT_NEAR(a[1], 1.0 / 1.0001, 1e-12);
  EXPECT_EQ(a[2], 0.0);
  EXPECT_EQ(a[3], 0.0);
}

TEST(GrpoLoss, PerTokenTermsMatchMegatron) {
  const nlohmann::json f = fixture();
  ASSERT_EQ(f["loss_cases"].size(), 7u);
  int above = 0, below = 0, weighted = 0, truncated = 0;
  for (const auto& c : f["loss_cases"]) {
    const GrpoLossOptions o = options_of(c);
    const int64_t B = c["B"], S = c["S"];
    const std::vector<double> cur = c["current"], old = c["old"], ref = c["ref"], adv = c["advantages"];
    const std::vector<double> inf = inference_of(c);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 0; s < S; ++s) {
        const size_t i = static_cast<size_t>(b * S + s);
        const GrpoTokenLoss t = grpo_token_loss(cur[i], old[i], ref[i], adv[b], o, inf.empty() ? nullptr : &inf[i]);
        weighted += t.is_weight != 1.0;
        truncated += o.is_truncation_coef > 0.0 && t.is_weight == o.is_truncation_coef;
        EXPECT_NEAR(t.loss, c["loss"][i].get<double>(), 1e-12) << c["name"] << " " << i;
        EXPECT_NEAR(t.kl_term, c["kl_term"][i].get<double>(), 1e-12);
        EXPECT_NEAR(t.ratio, c["ratios"][i].get<double>(), 1e-12);
        EXPECT_NEAR(t.entropy_term, c["entropy_term"][i].get<double>(), 1e-12);
        EXPECT_EQ(t.truncated_from_above, c["truncated_from_above"][i].get<int>() != 0);
        EXPECT_EQ(t.truncated_from_below, c["truncated_from_below"][i].get<int>() != 0);
        above += t.truncated_from_above;
        below += t.truncated_from_below;
      }
  }
  EXPECT_GT(above, 0);  // the cases exercise both clamps
  EXPECT_GT(below, 0);
  EXPECT_GT(weighted, 0);  // the importance-sampling cases weight tokens, and truncate some
  EXPECT_GT(truncated, 0);
}

TEST(GrpoLoss, ReducedLossAndGradientMatchMegatronAutograd) {
  const nlohmann::json f = fixture();
  for (const auto& c : f["loss_cases"]) {
    const int64_t B = c["B"], S = c["S"];
    const std::vector<double> cur = c["current"], old = c["old"], ref = c["ref"], adv = c["advantages"];
    const std::vector<double> mask_d = c["mask"];
    const std::vector<float> mask(mask_d.begin(), mask_d.end());
    const GrpoMicroBatchLoss m =
        grpo_micro_batch_loss(cur, old, ref, adv, mask, B, S, c["num_microbatches"].get<int64_t>(), options_of(c),
                              inference_of(c));
    EXPECT_NEAR(m.mb_loss, c["mb_loss"].get<double>(), 1e-12) << c["name"];
    const std::vector<double> want = c["grad"];
    ASSERT_EQ(m.grad.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(m.grad[i], want[i], 1e-12) << c["name"] << " " << i;
  }
}

// The loss's first pass over fresh rollouts (π = π_old) at the reference policy: ratio 1, no
// truncation, the KL term and its gradient exactly 0.
TEST(GrpoLoss, ZeroKlAtTheReferencePolicy) {
  GrpoLossOptions o;
  o.kl_beta = 0.5;
  for (double lp : {-0.1, -1.3, -4.0}) {
    const GrpoTokenLoss t = grpo_token_loss(lp, lp, lp, 0.7, o);
    EXPECT_EQ(t.kl_term, 0.0);
    EXPECT_EQ(t.ratio, 1.0);
    EXPECT_DOUBLE_EQ(t.loss, -0.7);
    EXPECT_DOUBLE_EQ(t.d_loss_d_current, -0.7);  // only the policy-gradient term
  }
}

// log_softmax(logits)[label] in double, the function the model's head computes (ℓ = lse − target).
double log_softmax_at(const std::vector<double>& z, int label) {
  double m = z[0];
  for (double v : z) m = std::max(m, v);
  double s = 0.0;
  for (double v : z) s += std::exp(v - m);
  return z[label] - m - std::log(s);
}

// d mb_loss / d logits by the chain rule (grad · (onehot − softmax)) against central finite
// differences of mb_loss computed through the log-softmax, per logit.
TEST(GrpoLoss, GradientMatchesFiniteDifferencesThroughLogSoftmax) {
  const int64_t B = 2, S = 3, V = 5;
  std::vector<double> logits(static_cast<size_t>(B * S * V));
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(0.7 * static_cast<double>(i) + 0.3) * 1.5;
  const std::vector<int> labels = {1, 4, 0, 2, 2, 3};
  std::vector<double> old(B * S), ref(B * S);
  for (int64_t i = 0; i < B * S; ++i) {
    old[i] = -1.0 - 0.15 * static_cast<double>(i % 4);
    ref[i] = -1.6 + 0.1 * static_cast<double>(i);
  }
  const std::vector<double> adv = {0.9, -1.1};
  const std::vector<float> mask = {1, 1, 0, 1, 1, 1};
  GrpoLossOptions o;
  o.clamp_eps_lower = 0.2;
  o.clamp_eps_upper = 0.3;
  o.kl_beta = 0.2;
  o.entropy_weight = 0.05;
  for (bool per_token : {false, true}) {  // the token mean over 2 micro-batches; --calculate-per-token-loss's sum
    o.per_token_loss = per_token;
    auto logprobs = [&](const std::vector<double>& z) {
      std::vector<double> lp(static_cast<size_t>(B * S));
      for (int64_t t = 0; t < B * S; ++t)
        lp[t] = log_softmax_at(std::vector<double>(z.begin() + t * V, z.begin() + (t + 1) * V), labels[t]);
      return lp;
    };
    auto objective = [&](const std::vector<double>& z) {
      return grpo_micro_batch_loss(logprobs(z), old, ref, adv, mask, B, S, 2, o).mb_loss;
    };
    const GrpoMicroBatchLoss m = grpo_micro_batch_loss(logprobs(logits), old, ref, adv, mask, B, S, 2, o);
    int checked = 0;
    for (int64_t t = 0; t < B * S; ++t) {
      const std::vector<double> row(logits.begin() + t * V, logits.begin() + (t + 1) * V);
      double mx = row[0], sum = 0.0;
      for (double v : row) mx = std::max(mx, v);
      for (double v : row) sum += std::exp(v - mx);
      for (int64_t v = 0; v < V; ++v) {
        const double p = std::exp(row[v] - mx) / sum;
        const double analytic = m.grad[t] * ((v == labels[t] ? 1.0 : 0.0) - p);
        std::vector<double> zp = logits, zm = logits;
        const double h = 1e-6;
        zp[t * V + v] += h;
        zm[t * V + v] -= h;
        const double fd = (objective(zp) - objective(zm)) / (2 * h);
        EXPECT_NEAR(analytic, fd, 1e-7) << "token " << t << " logit " << v << " per-token " << per_token;
        checked += std::abs(fd) > 1e-4;
      }
    }
    EXPECT_GT(checked, 10);
  }
}

// --calculate-per-token-loss: the micro-batch loss is the masked sum, whatever the micro-batch
// count, and its gradient the token mean's times the tokens and the micro-batches.
TEST(GrpoLoss, PerTokenLossIsTheMaskedSum) {
  const std::vector<double> cur = {-0.5, -1.2, -2.0, -0.9}, old = {-0.6, -1.0, -2.1, -0.8}, ref = {-0.7, -1.1, -1.9, -1.0};
  const std::vector<float> mask = {1, 1, 0, 1};
  GrpoLossOptions o;
  o.kl_beta = 0.3;
  o.clamp_eps_lower = o.clamp_eps_upper = 0.2;
  const GrpoMicroBatchLoss mean = grpo_micro_batch_loss(cur, old, ref, {0.8, -0.4}, mask, 2, 2, 4, o);
  o.per_token_loss = true;
  const GrpoMicroBatchLoss sum = grpo_micro_batch_loss(cur, old, ref, {0.8, -0.4}, mask, 2, 2, 4, o);
  EXPECT_EQ(sum.tokens, 3.0);
  EXPECT_DOUBLE_EQ(sum.mb_loss, sum.loss_sum);
  EXPECT_NEAR(sum.mb_loss, mean.mb_loss * 3.0 * 4.0, 1e-12);
  for (size_t i = 0; i < cur.size(); ++i) EXPECT_NEAR(sum.grad[i], mean.grad[i] * 3.0 * 4.0, 1e-12) << i;
  EXPECT_EQ(sum.grad[2], 0.0);  // masked
}

// A small step against the gradient raises the log-probability of the above-mean-reward
// completion and lowers that of the below-mean one (β = 0, fresh rollouts: π = π_old).
TEST(GrpoLoss, GradientStepFavoursAboveMeanRewards) {
  const std::vector<double> adv = grpo_advantages({{1.0, 0.0}});
  ASSERT_GT(adv[0], 0.0);
  ASSERT_LT(adv[1], 0.0);
  const std::vector<double> lp = {-1.2, -0.8, -1.0, -0.9};  // [2 sequences, 2 positions]
  GrpoLossOptions o;
  o.kl_beta = 0.0;
  const GrpoMicroBatchLoss m = grpo_micro_batch_loss(lp, lp, lp, adv, {1, 1, 1, 1}, 2, 2, 1, o);
  for (int i = 0; i < 2; ++i) EXPECT_LT(m.grad[i], 0.0) << "descending raises log π of the rewarded completion";
  for (int i = 2; i < 4; ++i) EXPECT_GT(m.grad[i], 0.0) << "descending lowers log π of the unrewarded one";
  std::vector<double> stepped = lp;
  for (size_t i = 0; i < lp.size(); ++i) stepped[i] -= 0.01 * m.grad[i];
  EXPECT_LT(grpo_micro_batch_loss(stepped, lp, lp, adv, {1, 1, 1, 1}, 2, 2, 1, o).mb_loss, m.mb_loss);
}

TEST(GrpoLoss, FullyMaskedMicroBatchDividesByOne) {
  GrpoLossOptions o;
  const GrpoMicroBatchLoss m = grpo_micro_batch_loss({-1.0, -2.0}, {-1.0, -2.0}, {-1.0, -2.0}, {1.0}, {0, 0}, 1, 2, 1, o);
  EXPECT_EQ(m.tokens, 0.0);
  EXPECT_EQ(m.mb_loss, 0.0);
  EXPECT_EQ(m.grad[0], 0.0);
}

}  // namespace
}  // namespace gale
