// Megatron's offline-distillation top-K KL (model/topk_kl.h): per-token values and gradient
// against the float64 torch-autograd fixture of tools/reference/logits_kd_reference.py, central
// differences of the C++ loss, and a two-rank vocabulary split equal to the whole vocabulary.
#include "model/topk_kl.h"
#include "testing_json.h"

#include <gtest/gtest.h>

#include <barrier>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

namespace gale {
namespace {

struct Case {
  std::vector<float> lp;
  std::vector<int64_t> idx;
  int64_t K = 0;
  TeacherTopK view() const { return TeacherTopK{lp.data(), idx.data(), K}; }
};

nlohmann::json fixture() {
  std::ifstream in(std::string(GALE_TEST_DATA_DIR) + "/golden/logits_kd/fixture.json");
  EXPECT_TRUE(in.good()) << "tests/data/golden/logits_kd/fixture.json (tools/reference/logits_kd_reference.py)";
  return nlohmann::json::parse(in);
}

Case case_of(const nlohmann::json& c) {
  Case k;
  k.lp = testing::json_floats(c["logprobs"]);
  for (const auto& i : c["indices"]) k.idx.push_back(i.get<int64_t>());
  k.K = c["K"];
  return k;
}

double masked_loss(const std::vector<float>& s, int64_t T, int64_t V, const Case& c, const std::vector<float>& mask) {
  std::vector<double> kl(static_cast<size_t>(T));
  topk_kl_forward_backward(s.data(), T, V, 0, c.view(), mask.data(), kl.data(), nullptr);
  double l = 0.0;
  for (int64_t t = 0; t < T; ++t) l += mask[t] * kl[t];
  return l;
}

// The fixture's logprobs are fp16 values (exact in f32), so Gale's inputs are the reference's:
// 1e-9 relative for the KL (f64 both sides), 1e-6 absolute for f32-stored gradients (|g| < 1).
TEST(TopkKl, MatchesTheTorchFixture) {
  const nlohmann::json f = fixture();
  const int64_t T = f["T"], V = f["V"];
  const std::vector<float> s = testing::json_floats(f["student"]), mask = testing::json_floats(f["loss_mask"]);
  ASSERT_EQ(f["cases"].size(), 3u);
  for (const auto& cj : f["cases"]) {
    SCOPED_TRACE(cj["name"].get<std::string>());
    const Case c = case_of(cj);
    std::vector<double> kl(static_cast<size_t>(T));
    std::vector<float> d(static_cast<size_t>(T * V), 7.0f);
    topk_kl_forward_backward(s.data(), T, V, 0, c.view(), mask.data(), kl.data(), d.data());
    double loss = 0.0;
    for (int64_t t = 0; t < T; ++t) {
      const double want = cj["kl"][t];
      EXPECT_NEAR(kl[t], want, 1e-9 * std::max(1.0, std::abs(want))) << "token " << t;
      loss += mask[t] * kl[t];
    }
    EXPECT_NEAR(loss, cj["loss"].get<double>(), 1e-9 * std::abs(cj["loss"].get<double>()));
    for (int64_t i = 0; i < T * V; ++i) EXPECT_NEAR(d[i], cj["grad"][i].get<double>(), 1e-6) << "logit " << i;
  }
}

// Central differences of the C++ masked loss (h = 2^-8 on f32 logits): the top-4 and top-P cases
// (smooth there; the full-support case sits on the ghost clamp, checked by the fixture above).
TEST(TopkKl, GradientMatchesFiniteDifferences) {
  const nlohmann::json f = fixture();
  const int64_t T = f["T"], V = f["V"];
  const std::vector<float> s = testing::json_floats(f["student"]), mask = testing::json_floats(f["loss_mask"]);
  for (int ci : {0, 1}) {
    const Case c = case_of(f["cases"][ci]);
    std::vector<double> kl(static_cast<size_t>(T));
    std::vector<float> d(static_cast<size_t>(T * V));
    topk_kl_forward_backward(s.data(), T, V, 0, c.view(), mask.data(), kl.data(), d.data());
    const float h = 1.0f / 256.0f;
    for (int64_t i = 0; i < T * V; ++i) {
      std::vector<float> up = s, dn = s;
      up[i] += h;
      dn[i] -= h;
      const double fd = (masked_loss(up, T, V, c, mask) - masked_loss(dn, T, V, c, mask)) / (2.0 * h);
      EXPECT_NEAR(d[i], fd, 1e-4) << "case " << ci << " logit " << i;
    }
  }
}

// Two ranks holding columns [0, 6) and [6, 13) (threads, an all-reduce over a shared buffer)
// reproduce the one-rank KL on both ranks and, side by side, the one-rank gradient.
TEST(TopkKl, VocabularySplitEqualsTheWholeVocabulary) {
  const nlohmann::json f = fixture();
  const int64_t T = f["T"], V = f["V"], split = 6;
  const std::vector<float> s = testing::json_floats(f["student"]), mask = testing::json_floats(f["loss_mask"]);
  for (const auto& cj : f["cases"]) {
    SCOPED_TRACE(cj["name"].get<std::string>());
    const Case c = case_of(cj);
    std::vector<double> kl(static_cast<size_t>(T));
    std::vector<float> d(static_cast<size_t>(T * V));
    topk_kl_forward_backward(s.data(), T, V, 0, c.view(), mask.data(), kl.data(), d.data());
    std::barrier sync(2);
    std::vector<double> shared[2];
    std::vector<double> kls[2];
    std::vector<float> ds[2];
    auto rank = [&](int r) {
      const int64_t off = r == 0 ? 0 : split, Vl = r == 0 ? split : V - split;
      std::vector<float> local(static_cast<size_t>(T * Vl));
      for (int64_t t = 0; t < T; ++t)
        for (int64_t v = 0; v < Vl; ++v) local[t * Vl + v] = s[t * V + off + v];
      KlAllReduce ar = [&](double* x, int64_t n, bool max) {
        shared[r].assign(x, x + n);
        sync.arrive_and_wait();
        for (int64_t i = 0; i < n; ++i) x[i] = max ? std::max(shared[0][i], shared[1][i]) : shared[0][i] + shared[1][i];
        sync.arrive_and_wait();
      };
      kls[r].resize(static_cast<size_t>(T));
      ds[r].resize(static_cast<size_t>(T * Vl));
      topk_kl_forward_backward(local.data(), T, Vl, off, c.view(), mask.data(), kls[r].data(), ds[r].data(), r == 0, ar);
    };
    std::thread other(rank, 1);
    rank(0);
    other.join();
    for (int r = 0; r < 2; ++r)
      for (int64_t t = 0; t < T; ++t) EXPECT_NEAR(kls[r][t], kl[t], 1e-12 * std::max(1.0, kl[t])) << r << " " << t;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t v = 0; v < V; ++v) {
        const float got = v < split ? ds[0][t * split + v] : ds[1][t * (V - split) + v - split];
        EXPECT_NEAR(got, d[t * V + v], 1e-7) << t << " " << v;
      }
  }
}

// The loss is zero with the student equal to the teacher's full distribution where the top-K hold
// all the mass (K = V, fp32 saved values: only round-off remains), and a zero coefficient zeroes
// its gradient row.
TEST(TopkKl, ZeroWhenTheStudentIsTheTeacher) {
  const int64_t T = 2, V = 5;
  std::vector<float> s = {0.5f, -1.0f, 2.0f, 0.0f, 1.0f, -0.5f, 0.25f, 0.75f, -2.0f, 1.5f};
  Case c;
  c.K = V;
  for (int64_t t = 0; t < T; ++t) {
    double m = -INFINITY, z = 0.0;
    for (int64_t v = 0; v < V; ++v) m = std::max(m, static_cast<double>(s[t * V + v]));
    for (int64_t v = 0; v < V; ++v) z += std::exp(s[t * V + v] - m);
    for (int64_t v = 0; v < V; ++v) {
      c.lp.push_back(static_cast<float>(s[t * V + v] - m - std::log(z)));
      c.idx.push_back(v);
    }
  }
  std::vector<double> kl(T);
  const std::vector<float> coef = {1.0f, 0.0f};
  std::vector<float> d(T * V, 3.0f);
  topk_kl_forward_backward(s.data(), T, V, 0, c.view(), coef.data(), kl.data(), d.data());
  for (double k : kl) EXPECT_NEAR(k, 0.0, 1e-6);
  for (int64_t v = 0; v < V; ++v) {
    EXPECT_NEAR(d[v], 0.0f, 1e-6);
    EXPECT_EQ(d[V + v], 0.0f);
  }
}

}  // namespace
}  // namespace gale
