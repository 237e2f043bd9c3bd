// QAD's distillation loss (model/logits_kl.h): the per-token KL, its reductions and its gradient
// with respect to the student's logits against the numpy fixture of
// tools/reference/qad_kl_reference.py and against central differences of the C++ loss itself.
#include "model/logits_kl.h"
#include "testing_json.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

namespace gale {
namespace {

KlReduction reduction_of(const std::string& r) { return r == "sum" ? KlReduction::kSum : KlReduction::kMean; }

// weight · reduced KL of student s against teacher z (the objective QAD differentiates).
double objective(const std::vector<float>& s, const std::vector<float>& z, const std::vector<float>& mask,
                 int64_t T, int64_t V, double tau, KlReduction r, double weight) {
  std::vector<double> kl(static_cast<size_t>(T));
  logits_kl_per_token(s.data(), z.data(), T, V, tau, kl.data());
  return weight * reduce_kl(kl, mask, r);
}

// The gradient of objective() by logits_kl_backward: coefficient weight·mask_t (/ Σ mask for mean).
std::vector<float> gradient(const std::vector<float>& s, const std::vector<float>& z, const std::vector<float>& mask,
                            int64_t T, int64_t V, double tau, KlReduction r, double weight) {
  double tokens = 0.0;
  for (float m : mask) tokens += m;
  std::vector<float> coef(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t)
    coef[t] = static_cast<float>(weight * mask[t] / (r == KlReduction::kMean ? tokens : 1.0));
  std::vector<float> d(static_cast<size_t>(T * V));
  logits_kl_backward(s.data(), z.data(), T, V, tau, coef.data(), d.data());
  return d;
}

// The numpy fixture: float64 per-token KL, reduced term and central-difference gradients. Gale
// computes in f64 from the same f32 logits, so the tolerances are round-off ones: 1e-9 relative
// for the KL values, 1e-6 absolute for gradients (stored as f32 here: |g| < 1, f32 ulp ~6e-8).
TEST(LogitsKl, MatchesTheNumpyFixture) {
  std::ifstream in(std::string(GALE_TEST_DATA_DIR) + "/golden/qad_kl/fixture.json");
  ASSERT_TRUE(in.good()) << "tests/data/golden/qad_kl/fixture.json (tools/reference/qad_kl_reference.py)";
  const nlohmann::json f = nlohmann::json::parse(in);
  const int64_t T = f["T"], V = f["V"];
  const std::vector<float> s = testing::json_floats(f["student"]), z = testing::json_floats(f["teacher"]), mask = testing::json_floats(f["mask"]);
  ASSERT_EQ(static_cast<int64_t>(s.size()), T * V);
  for (const auto& c : f["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const double tau = c["temperature"], weight = c["weight"];
    const KlReduction r = reduction_of(c["reduction"]);
    std::vector<double> kl(static_cast<size_t>(T));
    logits_kl_per_token(s.data(), z.data(), T, V, tau, kl.data());
    for (int64_t t = 0; t < T; ++t) {
      const double want = c["kl"][t];
      EXPECT_NEAR(kl[t], want, 1e-9 * std::max(1.0, std::abs(want))) << "token " << t;
      EXPECT_GT(kl[t], 0.0);
    }
    const double value = c["value"];
    EXPECT_NEAR(reduce_kl(kl, mask, r), value, 1e-9 * std::max(1.0, std::abs(value)));
    const std::vector<float> d = gradient(s, z, mask, T, V, tau, r, weight);
    for (int64_t i = 0; i < T * V; ++i) {
      const double want = c["grad"][i];
      EXPECT_NEAR(d[i], want, 1e-6) << "logit " << i;
    }
  }
}

// Central differences of the C++ objective itself (h = 2^-7 on f32 logits, exact steps; the KL is
// smooth with derivatives of order 1, so the O(h²) error is below 1e-4, the tolerance).
TEST(LogitsKl, GradientMatchesFiniteDifferences) {
  const int64_t T = 4, V = 7;
  std::vector<float> s(T * V), z(T * V);
  for (int64_t i = 0; i < T * V; ++i) {
    s[i] = static_cast<float>(std::sin(0.7 * i) * 2.0);
    z[i] = static_cast<float>(std::cos(1.3 * i) * 1.5);
  }
  const std::vector<float> mask = {1, 0, 1, 1};
  for (double tau : {1.0, 2.5}) {
    for (KlReduction r : {KlReduction::kMean, KlReduction::kSum}) {
      const double weight = 0.8;
      const std::vector<float> d = gradient(s, z, mask, T, V, tau, r, weight);
      const float h = 1.0f / 128.0f;
      for (int64_t i = 0; i < T * V; ++i) {
        std::vector<float> up = s, dn = s;
        up[i] += h;
        dn[i] -= h;
        const double fd = (objective(up, z, mask, T, V, tau, r, weight) - objective(dn, z, mask, T, V, tau, r, weight)) /
                          (2.0 * h);
        EXPECT_NEAR(d[i], fd, 1e-4) << "tau " << tau << " logit " << i;
      }
    }
  }
}

// The teacher is the student: every token's KL is 0 and so is the gradient (up to round-off of
// the same f64 log-sum-exp: exactly 0 here, as both rows are computed identically).
TEST(LogitsKl, IdenticalLogitsGiveZero) {
  const int64_t T = 3, V = 5;
  std::vector<float> s(T * V);
  for (int64_t i = 0; i < T * V; ++i) s[i] = static_cast<float>(i % 4) - 1.5f;
  std::vector<double> kl(T, -1.0);
  logits_kl_per_token(s.data(), s.data(), T, V, 2.0, kl.data());
  for (double k : kl) EXPECT_EQ(k, 0.0);
  const std::vector<float> d = gradient(s, s, {1, 1, 1}, T, V, 2.0, KlReduction::kMean, 1.0);
  for (float x : d) EXPECT_EQ(x, 0.0f);
}

// The one-pass function the model runs equals the two separate ones (same f64 formulas, other
// operation order: 1e-12 relative for kl, 1e-7 absolute for f32 gradients), also with permuted
// teacher rows; a zero coefficient zeroes its row.
TEST(LogitsKl, OnePassEqualsTheSeparateFunctions) {
  const int64_t T = 5, V = 9;
  std::vector<float> s(T * V), z(T * V), z_perm(T * V);
  for (int64_t i = 0; i < T * V; ++i) {
    s[i] = static_cast<float>(std::sin(0.37 * i) * 3.0);
    z[i] = static_cast<float>(std::cos(0.91 * i) * 2.0);
  }
  const std::vector<int64_t> rows = {3, 0, 4, 1, 2};  // token t's teacher row
  for (int64_t t = 0; t < T; ++t) std::copy(z.begin() + t * V, z.begin() + (t + 1) * V, z_perm.begin() + rows[t] * V);
  const std::vector<float> coef = {0.5f, 0.0f, 1.0f, 2.0f, 0.25f};
  for (double tau : {1.0, 0.7}) {
    std::vector<double> kl(T), kl1(T);
    std::vector<float> d(T * V), d1(T * V, 1.0f);
    logits_kl_per_token(s.data(), z.data(), T, V, tau, kl.data());
    logits_kl_backward(s.data(), z.data(), T, V, tau, coef.data(), d.data());
    logits_kl_forward_backward(s.data(), z_perm.data(), T, V, tau, coef.data(), kl1.data(), d1.data(), rows.data());
    for (int64_t t = 0; t < T; ++t) EXPECT_NEAR(kl1[t], kl[t], 1e-12 * kl[t]) << t;
    for (int64_t i = 0; i < T * V; ++i) EXPECT_NEAR(d1[i], d[i], 1e-7) << i;
    for (int64_t v = 0; v < V; ++v) EXPECT_EQ(d1[1 * V + v], 0.0f);
    std::vector<double> kl_same(T);
    logits_kl_forward_backward(s.data(), s.data(), T, V, tau, coef.data(), kl_same.data(), d1.data());
    for (double k : kl_same) EXPECT_EQ(k, 0.0);
    for (float x : d1) EXPECT_EQ(x, 0.0f);
  }
}

// The vocabulary-parallel path with one rank holding the whole vocabulary (the all-reduce is the
// identity; it is called for the maxima, the sums and the KL) equals the one-pass path, with a
// teacher row stride wider than the rows (a column slice of wider logits).
TEST(LogitsKl, VocabularyParallelPathOnOneRankEqualsOnePass) {
  const int64_t T = 4, V = 6, ld = 10, col = 3;
  std::vector<float> s(T * V), wide(T * ld, 100.0f), z(T * V);
  for (int64_t i = 0; i < T * V; ++i) {
    s[i] = static_cast<float>(std::sin(0.53 * i) * 2.0);
    z[i] = static_cast<float>(std::cos(0.29 * i) * 2.5);
    wide[(i / V) * ld + col + i % V] = z[i];
  }
  const std::vector<float> coef = {1.0f, 0.5f, 0.0f, 2.0f};
  std::vector<double> kl(T), kl_par(T);
  std::vector<float> d(T * V), d_par(T * V);
  int calls = 0;
  const KlAllReduce identity = [&](double*, int64_t, bool) { ++calls; };
  logits_kl_forward_backward(s.data(), z.data(), T, V, 1.7, coef.data(), kl.data(), d.data());
  logits_kl_forward_backward(s.data(), wide.data() + col, T, V, 1.7, coef.data(), kl_par.data(), d_par.data(), nullptr,
                             ld, identity);
  EXPECT_EQ(calls, 3);
  for (int64_t t = 0; t < T; ++t) EXPECT_NEAR(kl_par[t], kl[t], 1e-12 * kl[t]) << t;
  for (int64_t i = 0; i < T * V; ++i) EXPECT_NEAR(d_par[i], d[i], 1e-7) << i;
}

TEST(LogitsKl, ReductionsAndEmptyMask) {
  const std::vector<double> kl = {1.0, 2.0, 4.0};
  EXPECT_DOUBLE_EQ(reduce_kl(kl, {1, 0, 1}, KlReduction::kMean), 2.5);
  EXPECT_DOUBLE_EQ(reduce_kl(kl, {1, 0, 1}, KlReduction::kSum), 5.0);
  EXPECT_EQ(reduce_kl(kl, {0, 0, 0}, KlReduction::kMean), 0.0);  // no token counts: 0, not NaN
  EXPECT_EQ(reduce_kl(kl, {0, 0, 0}, KlReduction::kSum), 0.0);
}

}  // namespace
}  // namespace gale
