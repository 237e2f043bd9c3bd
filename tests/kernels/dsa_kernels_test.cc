// DeepSeek sparse attention kernels (kernels/cpu/dsa.h): the numpy golden fixture
// (tools/reference/dsa_reference.py: top-k, sparse attention and its gradients, the dense and sparse
// indexer KL and its gradients), top-k ≥ S equal to dense causal attention, finite differences of the
// sparse attention and of the indexer loss, the fused sparse attention against the reference, and
// decoding's problems (the last queries at their positions over every key) against the whole one.
#include "kernels/cpu/dsa.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <vector>

#include "kernels/cpu/attention.h"
#include "testing.h"
#include "testing_json.h"

namespace gale {
namespace {

using testing::random_vector;

// max |a − b| / max(max |b|, 1e-3)
double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0.0, scale = 1e-3;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    worst = std::max(worst, std::abs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::abs(double(b[i])));
  }
  return worst / scale;
}

using SparseForward = decltype(&dsa_sparse_attention_forward_ref);
using SparseBackward = decltype(&dsa_sparse_attention_backward_ref);

class DsaGolden : public ::testing::TestWithParam<bool> {};  // fused sparse attention?

TEST_P(DsaGolden, MatchesTheNumpyReference) {
  const bool fused = GetParam();
  std::ifstream in(std::string(GALE_TEST_DATA_DIR) + "/golden/dsa_kernels/fixture.json");
  ASSERT_TRUE(in.good()) << "tests/data/golden/dsa_kernels/fixture.json (tools/reference/dsa_reference.py)";
  const nlohmann::json f = nlohmann::json::parse(in);
  const int64_t B = f["B"], S = f["S"], NI = f["NI"], DI = f["DI"], K = f["K"], NH = f["NH"], HD = f["HD"];
  const int64_t T = B * S;
  AttentionProblem p;
  p.B = B;
  p.Sq = p.Sk = S;
  p.NH = p.KV = NH;
  p.HD = HD;
  p.scale = static_cast<float>(f["scale"].get<double>());
  const std::vector<float> qI = testing::json_floats(f["qI"]), kI = testing::json_floats(f["kI"]), w = testing::json_floats(f["w"]);
  const std::vector<float> q = testing::json_floats(f["q"]), k = testing::json_floats(f["k"]), v = testing::json_floats(f["v"]), dout = testing::json_floats(f["dout"]);
  DsaIndexerProblem ip{&p, NI, DI, K, qI.data(), kI.data(), w.data()};

  std::vector<int32_t> idx(T * K);
  dsa_indexer_topk_ref(ip, idx.data());
  for (int64_t e = 0; e < T * K; ++e) ASSERT_EQ(idx[e], f["idx"][e].get<int>()) << "entry " << e;

  const HeadLayout l = contiguous_heads_layout(NH, HD);
  SparseForward fwd = fused ? dsa_sparse_attention_forward_fused : dsa_sparse_attention_forward_ref;
  SparseBackward bwd = fused ? dsa_sparse_attention_backward_fused : dsa_sparse_attention_backward_ref;
  std::vector<float> out(T * NH * HD), lse(B * NH * S);
  fwd(p, idx.data(), K, q.data(), l, k.data(), l, v.data(), l, out.data(), lse.data());
  EXPECT_LT(rel_err(out, testing::json_floats(f["out"])), 1e-5);
  EXPECT_LT(rel_err(lse, testing::json_floats(f["lse"])), 1e-5);
  std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
  bwd(p, idx.data(), K, q.data(), l, k.data(), l, v.data(), l, out.data(), lse.data(), dout.data(), dq.data(),
      dk.data(), dv.data());
  EXPECT_LT(rel_err(dq, testing::json_floats(f["attention_dq"])), 1e-5);
  EXPECT_LT(rel_err(dk, testing::json_floats(f["attention_dk"])), 1e-5);
  EXPECT_LT(rel_err(dv, testing::json_floats(f["attention_dv"])), 1e-5);

  DsaTeacher teacher{&p, q.data(), l, k.data(), l};
  for (const bool sparse : {false, true}) {
    const std::string name = sparse ? "kl_sparse" : "kl_dense";
    const double kl = dsa_indexer_loss_forward_ref(ip, teacher, idx.data(), sparse);
    EXPECT_NEAR(kl, f[name].get<double>(), 1e-5 * std::max(1.0, std::abs(f[name].get<double>()))) << name;
    std::vector<float> gq(qI.size()), gk(kI.size()), gw(w.size());
    dsa_indexer_loss_backward_ref(ip, teacher, idx.data(), sparse, 1.0, gq.data(), gk.data(), gw.data());
    EXPECT_LT(rel_err(gq, testing::json_floats(f[name + "_dq"])), 1e-5) << name;
    EXPECT_LT(rel_err(gk, testing::json_floats(f[name + "_dk"])), 1e-5) << name;
    EXPECT_LT(rel_err(gw, testing::json_floats(f[name + "_dw"])), 1e-5) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, DsaGolden, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "fused" : "reference"; });

// A random problem: B 2, S 23 (or S), NH 3, HD 7, NI 2, DI 6; masks as given.
struct Problem {
  AttentionProblem p;
  int64_t NI = 2, DI = 6, T = 0;
  std::vector<float> qI, kI, w, q, k, v, dout;
  std::vector<int32_t> doc_ids;
  HeadLayout l;
  explicit Problem(bool documents, int64_t window = 0, int64_t S = 23) {
    p.B = 2;
    p.Sq = p.Sk = S;
    p.NH = p.KV = 3;
    p.HD = 7;
    p.scale = 0.4f;
    p.window = window;
    T = p.B * p.Sq;
    qI = random_vector(T * NI * DI, 1);
    kI = random_vector(T * DI, 2);
    w = random_vector(T * NI, 3);
    q = random_vector(T * p.NH * p.HD, 4);
    k = random_vector(T * p.NH * p.HD, 5);
    v = random_vector(T * p.NH * p.HD, 6);
    dout = random_vector(T * p.NH * p.HD, 7);
    for (float& x : q) x *= 3.0f;  // peaked attention: a meaningful top-k
    if (documents) {
      for (int64_t b = 0; b < p.B; ++b)
        for (int64_t s = 0; s < p.Sq; ++s) doc_ids.push_back(s < 9 + 4 * b ? 0 : 1);
      p.q_doc_ids = p.k_doc_ids = doc_ids.data();
    }
    l = contiguous_heads_layout(p.NH, p.HD);
  }
  DsaIndexerProblem indexer(int64_t K) const { return DsaIndexerProblem{&p, NI, DI, K, qI.data(), kI.data(), w.data()}; }
  std::vector<int32_t> topk(int64_t K) const {
    std::vector<int32_t> idx(T * K);
    dsa_indexer_topk_ref(indexer(K), idx.data());
    return idx;
  }
};

TEST(DsaKernels, TopkCoversEveryVisibleKeyWhenKAtLeastS) {
  for (bool documents : {false, true}) {
    const Problem pr(documents);
    const int64_t K = pr.p.Sq + 3;
    const std::vector<int32_t> idx = pr.topk(K);
    for (int64_t t = 0; t < pr.T; ++t) {
      const int64_t b = t % pr.p.B, i = t / pr.p.B;
      int64_t r = 0;
      for (int64_t j = 0; j < pr.p.Sk; ++j)
        if (attention_visible(pr.p, b, i, j)) EXPECT_EQ(idx[t * K + r++], j);
      for (; r < K; ++r) EXPECT_EQ(idx[t * K + r], -1);
    }
  }
}

TEST(DsaKernels, TopkKeepsTheHighestIndexScores) {
  const Problem pr(false);
  const int64_t K = 5;
  const std::vector<int32_t> idx = pr.topk(K);
  const DsaIndexerProblem ip = pr.indexer(K);
  for (int64_t t = 0; t < pr.T; ++t) {
    const int64_t b = t % pr.p.B, i = t / pr.p.B;
    float worst_kept = INFINITY;
    std::vector<bool> kept(pr.p.Sk, false);
    for (int64_t r = 0; r < K; ++r) {
      if (idx[t * K + r] < 0) continue;
      kept[idx[t * K + r]] = true;
      worst_kept = std::min(worst_kept, dsa_index_score(ip, b, i, idx[t * K + r]));
      if (r > 0 && idx[t * K + r] >= 0) EXPECT_LT(idx[t * K + r - 1], idx[t * K + r]);  // ascending
    }
    for (int64_t j = 0; j <= i; ++j)
      if (!kept[j]) EXPECT_LE(dsa_index_score(ip, b, i, j), worst_kept + 1e-5f) << "row " << t << " key " << j;
  }
}

// With K ≥ S the sparse attention is the dense kernel, forward and backward (reference and fused).
TEST(DsaKernels, SparseAttentionWithAllKeysEqualsDenseAttention) {
  for (bool documents : {false, true})
    for (bool fused : {false, true}) {
      const Problem pr(documents, documents ? 0 : 6);
      const int64_t K = pr.p.Sq;
      const std::vector<int32_t> idx = pr.topk(K);
      const size_t n = pr.q.size();
      std::vector<float> out(n), lse(pr.p.B * pr.p.NH * pr.p.Sq), out_d(n), lse_d(lse.size());
      SparseForward fwd = fused ? dsa_sparse_attention_forward_fused : dsa_sparse_attention_forward_ref;
      SparseBackward bwd = fused ? dsa_sparse_attention_backward_fused : dsa_sparse_attention_backward_ref;
      fwd(pr.p, idx.data(), K, pr.q.data(), pr.l, pr.k.data(), pr.l, pr.v.data(), pr.l, out.data(), lse.data());
      attention_forward_ref(pr.p, pr.q.data(), pr.l, pr.k.data(), pr.l, pr.v.data(), pr.l, out_d.data(), lse_d.data());
      EXPECT_LT(rel_err(out, out_d), 2e-6);
      EXPECT_LT(rel_err(lse, lse_d), 2e-6);
      std::vector<float> dq(n), dk(n), dv(n), dq_d(n), dk_d(n), dv_d(n);
      bwd(pr.p, idx.data(), K, pr.q.data(), pr.l, pr.k.data(), pr.l, pr.v.data(), pr.l, out.data(), lse.data(),
          pr.dout.data(), dq.data(), dk.data(), dv.data());
      attention_backward_ref(pr.p, pr.q.data(), pr.l, pr.k.data(), pr.l, pr.v.data(), pr.l, out_d.data(), lse_d.data(),
                             pr.dout.data(), dq_d.data(), dk_d.data(), dv_d.data());
      EXPECT_LT(rel_err(dq, dq_d), 1e-5) << documents << fused;
      EXPECT_LT(rel_err(dk, dk_d), 1e-5) << documents << fused;
      EXPECT_LT(rel_err(dv, dv_d), 1e-5) << documents << fused;
    }
}

// Σ over a random direction of f's gradient against central differences (double accumulation).
double directional(const std::function<double()>& f, std::vector<float>& x, const std::vector<float>& dir, double eps) {
  std::vector<float> x0 = x;
  for (size_t i = 0; i < x.size(); ++i) x[i] = x0[i] + static_cast<float>(eps) * dir[i];
  const double plus = f();
  for (size_t i = 0; i < x.size(); ++i) x[i] = x0[i] - static_cast<float>(eps) * dir[i];
  const double minus = f();
  x = x0;
  return (plus - minus) / (2 * eps);
}

double dotv(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * b[i];
  return s;
}

TEST(DsaKernels, SparseAttentionGradientsMatchFiniteDifferences) {
  for (bool fused : {false, true}) {
    Problem pr(true);
    const int64_t K = 4;
    const std::vector<int32_t> idx = pr.topk(K);
    SparseForward fwd = fused ? dsa_sparse_attention_forward_fused : dsa_sparse_attention_forward_ref;
    SparseBackward bwd = fused ? dsa_sparse_attention_backward_fused : dsa_sparse_attention_backward_ref;
    const size_t n = pr.q.size();
    std::vector<float> out(n), lse(pr.p.B * pr.p.NH * pr.p.Sq);
    auto objective = [&] {
      fwd(pr.p, idx.data(), K, pr.q.data(), pr.l, pr.k.data(), pr.l, pr.v.data(), pr.l, out.data(), lse.data());
      return dotv(out, pr.dout);
    };
    objective();
    std::vector<float> dq(n), dk(n), dv(n);
    bwd(pr.p, idx.data(), K, pr.q.data(), pr.l, pr.k.data(), pr.l, pr.v.data(), pr.l, out.data(), lse.data(),
        pr.dout.data(), dq.data(), dk.data(), dv.data());
    struct Case {
      std::vector<float>* x;
      const std::vector<float>* g;
      const char* name;
    };
    for (const Case& c : {Case{&pr.q, &dq, "dq"}, Case{&pr.k, &dk, "dk"}, Case{&pr.v, &dv, "dv"}}) {
      const std::vector<float> dir = random_vector(n, 11);
      const double analytic = dotv(*c.g, dir), numeric = directional(objective, *c.x, dir, 1e-3);
      EXPECT_NEAR(analytic, numeric, 2e-3 * std::max(1.0, std::abs(analytic))) << c.name << (fused ? " fused" : "");
    }
  }
}

TEST(DsaKernels, IndexerLossGradientsMatchFiniteDifferences) {
  for (bool sparse : {false, true})
    for (bool documents : {false, true}) {
      Problem pr(documents);
      const int64_t K = 5;
      const std::vector<int32_t> idx = pr.topk(K);  // fixed: the loss is differentiated at this selection
      const DsaTeacher teacher{&pr.p, pr.q.data(), pr.l, pr.k.data(), pr.l};
      auto objective = [&] { return dsa_indexer_loss_forward_ref(pr.indexer(K), teacher, idx.data(), sparse); };
      std::vector<float> gq(pr.qI.size()), gk(pr.kI.size()), gw(pr.w.size());
      dsa_indexer_loss_backward_ref(pr.indexer(K), teacher, idx.data(), sparse, 1.0, gq.data(), gk.data(), gw.data());
      struct Case {
        std::vector<float>* x;
        const std::vector<float>* g;
        const char* name;
      };
      for (const Case& c : {Case{&pr.qI, &gq, "dqI"}, Case{&pr.kI, &gk, "dkI"}, Case{&pr.w, &gw, "dw"}}) {
        const std::vector<float> dir = random_vector(c.x->size(), 12);
        const double analytic = dotv(*c.g, dir), numeric = directional(objective, *c.x, dir, 1e-3);
        EXPECT_NEAR(analytic, numeric, 5e-3 * std::max(1.0, std::abs(analytic)))
            << c.name << (sparse ? " sparse" : " dense") << (documents ? " documents" : "");
      }
      EXPECT_GT(objective(), 0.0);
    }
}

TEST(DsaKernels, FusedSparseAttentionMatchesReference) {
  Problem pr(true);
  for (const int64_t K : {1, 3, 8, 70}) {  // 70 > 64: two online-softmax blocks
    Problem big(false, 0, 90);
    for (Problem* p : {&pr, &big}) {
      const std::vector<int32_t> idx = p->topk(K);
      const size_t n = p->q.size();
      std::vector<float> o1(n), o2(n), l1(p->p.B * p->p.NH * p->p.Sq), l2(l1.size());
      dsa_sparse_attention_forward_ref(p->p, idx.data(), K, p->q.data(), p->l, p->k.data(), p->l, p->v.data(), p->l,
                                       o1.data(), l1.data());
      dsa_sparse_attention_forward_fused(p->p, idx.data(), K, p->q.data(), p->l, p->k.data(), p->l, p->v.data(), p->l,
                                         o2.data(), l2.data());
      EXPECT_LT(rel_err(o2, o1), 2e-6) << "K " << K;
      EXPECT_LT(rel_err(l2, l1), 2e-6) << "K " << K;
      std::vector<float> a(n), b(n), c(n), a2(n), b2(n), c2(n);
      dsa_sparse_attention_backward_ref(p->p, idx.data(), K, p->q.data(), p->l, p->k.data(), p->l, p->v.data(), p->l,
                                        o1.data(), l1.data(), p->dout.data(), a.data(), b.data(), c.data());
      dsa_sparse_attention_backward_fused(p->p, idx.data(), K, p->q.data(), p->l, p->k.data(), p->l, p->v.data(), p->l,
                                          o1.data(), l1.data(), p->dout.data(), a2.data(), b2.data(), c2.data());
      EXPECT_LT(rel_err(a2, a), 1e-5) << "K " << K;
      EXPECT_LT(rel_err(b2, b), 1e-5) << "K " << K;
      EXPECT_LT(rel_err(c2, c), 1e-5) << "K " << K;
    }
  }
}

// Decoding's problems (model/dsa_indexer.h dsa_indexer_decode): the last n query rows at their
// positions over all Sk keys (Sq = n < Sk) select the keys, and attend (reference and fused) to give
// the outputs, of those rows of the whole square problem — causal, and with a sliding window.
TEST(DsaKernels, TrailingQueriesAtTheirPositionsGiveTheSquareProblemsRows) {
  for (const int64_t window : {0, 7}) {
    const Problem pr(false, window);
    const int64_t K = 5, B = pr.p.B, S = pr.p.Sq, NH = pr.p.NH, HD = pr.p.HD;
    const std::vector<int32_t> whole = pr.topk(K);
    std::vector<float> out(pr.q.size()), lse(B * NH * S);
    dsa_sparse_attention_forward_ref(pr.p, whole.data(), K, pr.q.data(), pr.l, pr.k.data(), pr.l, pr.v.data(), pr.l,
                                     out.data(), lse.data());
    for (const int64_t n : {1, 3}) {
      const int64_t first = S - n;  // rows first·B ... S·B − 1
      std::vector<int32_t> positions;
      for (int64_t i = first; i < S; ++i) positions.push_back(static_cast<int32_t>(i));
      AttentionProblem p = pr.p;
      p.Sq = n;
      p.q_positions = positions.data();
      const DsaIndexerProblem ip{&p, pr.NI, pr.DI, K, pr.qI.data() + first * B * pr.NI * pr.DI, pr.kI.data(),
                                 pr.w.data() + first * B * pr.NI};
      std::vector<int32_t> idx(n * B * K);
      dsa_indexer_topk_ref(ip, idx.data());
      EXPECT_EQ(idx, std::vector<int32_t>(whole.begin() + first * B * K, whole.end())) << "window " << window << ", n " << n;
      const float* q = pr.q.data() + first * B * NH * HD;
      const std::vector<float> want(out.begin() + first * B * NH * HD, out.end());
      for (SparseForward f : {&dsa_sparse_attention_forward_ref, &dsa_sparse_attention_forward_fused}) {
        std::vector<float> o(n * B * NH * HD), l(B * NH * n);
        f(p, idx.data(), K, q, pr.l, pr.k.data(), pr.l, pr.v.data(), pr.l, o.data(), l.data());
        EXPECT_LT(rel_err(o, want), 2e-6) << "window " << window << ", n " << n;
      }
    }
  }
}

}  // namespace
}  // namespace gale
