// --output-logit-dtype bf16 in the LM head kernels (kernels/op_table.h LmHeadProblem::bf16_logits):
// the loss of the bf16-rounded logits and the bf16-rounded logit gradient, against a float64
// reference on logits that f32 computes exactly; the fused builds (recompute and eager paths, vocab
// slices) agree with the reference kernel; without the flag nothing is rounded.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "fused_test_util.h"
#include "kernels/cpu/fused_ops.h"
#include "kernels/op_table.h"
#include "testing.h"

namespace gale {
namespace {

using testing::peak_rel_error;
using testing::runnable_isas;

float bf16_round(double v) { return bf16_to_float(float_to_bf16(static_cast<float>(v))); }

// x = i/4 (|i| ≤ 4) and W = k/64 (|k| ≤ 32): every logit is a multiple of 1/256 below 16·0.5 in
// size, exact in f32 whatever the summation order, and mostly not a bf16 value (8 significant bits).
struct Problem {
  int64_t T, H, V;
  std::vector<float> x, W;
  std::vector<int32_t> targets;
  Problem(int64_t t, int64_t h, int64_t v) : T(t), H(h), V(v), x(t * h), W(v * h), targets(t) {
    uint64_t s = 12345;
    auto next = [&](int64_t range) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      return static_cast<int64_t>((s >> 33) % static_cast<uint64_t>(2 * range + 1)) - range;
    };
    for (float& e : x) e = static_cast<float>(next(4)) / 4.0f;
    for (float& e : W) e = static_cast<float>(next(32)) / 64.0f;
    for (int64_t i = 0; i < T; ++i) targets[i] = static_cast<int32_t>((i * 7 + 3) % V);
  }
  double logit(int64_t t, int64_t v) const {
    double a = 0.0;
    for (int64_t k = 0; k < H; ++k) a += static_cast<double>(x[t * H + k]) * W[v * H + k];
    return a;
  }
  LmHeadProblem head(bool bf16, int64_t Vl, int64_t start, const float* dloss = nullptr, float* dW = nullptr) const {
    LmHeadProblem p{T, H, Vl, start, x.data(), W.data() + start * H, targets.data(), Vl == V, dloss, dW};
    p.bf16_logits = bf16;
    return p;
  }
};

// Float64 loss and logit gradient of one token from its (rounded or not) logits.
struct TokenRef {
  double loss = 0.0;
  std::vector<double> grad;  // (softmax − onehot)·dloss
};
TokenRef token_ref(const Problem& pr, int64_t t, bool bf16, double dloss) {
  std::vector<double> l(static_cast<size_t>(pr.V));
  double m = -1e300;
  for (int64_t v = 0; v < pr.V; ++v) {
    l[v] = bf16 ? bf16_round(pr.logit(t, v)) : pr.logit(t, v);
    m = std::max(m, l[v]);
  }
  double se = 0.0;
  for (double e : l) se += std::exp(e - m);
  const double lse = m + std::log(se);
  TokenRef r;
  r.loss = lse - l[pr.targets[t]];
  r.grad.resize(l.size());
  for (int64_t v = 0; v < pr.V; ++v) r.grad[v] = (std::exp(l[v] - lse) - (v == pr.targets[t] ? 1.0 : 0.0)) * dloss;
  return r;
}

double kernel_loss(const std::vector<float>& st, int64_t T, int64_t t) {
  return static_cast<double>(st[t]) + std::log(static_cast<double>(st[T + t])) - st[2 * T + t];
}

std::vector<const OpTable*> all_tables() {
  static const OpTable ref = reference_ops();
  static std::vector<OpTable> fused;
  if (fused.empty())
    for (Isa isa : runnable_isas()) {
      OpTable t = reference_ops();
      GALE_CHECK(install_all_fused_kernels(t, isa).ok());
      fused.push_back(t);
    }
  std::vector<const OpTable*> out = {&ref};
  for (const OpTable& t : fused) out.push_back(&t);
  return out;
}

// The loss of each token is the float64 loss of its bf16-rounded logits, which differs from that of
// the exact logits by more than the tolerance.
TEST(LmHeadBf16Logits, LossOfTheRoundedLogits) {
  const Problem pr(12, 16, 40);
  for (const OpTable* ops : all_tables()) {
    std::vector<float> st(3 * pr.T), st32(3 * pr.T);
    ops->lm_head_loss_forward(pr.head(true, pr.V, 0), st.data(), st.data() + pr.T, st.data() + 2 * pr.T, nullptr);
    ops->lm_head_loss_forward(pr.head(false, pr.V, 0), st32.data(), st32.data() + pr.T, st32.data() + 2 * pr.T,
                              nullptr);
    int differs = 0;
    for (int64_t t = 0; t < pr.T; ++t) {
      const double want = token_ref(pr, t, true, 0.0).loss, exact = token_ref(pr, t, false, 0.0).loss;
      EXPECT_NEAR(kernel_loss(st, pr.T, t), want, 2e-6 * (1.0 + std::fabs(want))) << "token " << t;
      EXPECT_NEAR(kernel_loss(st32, pr.T, t), exact, 2e-6 * (1.0 + std::fabs(exact))) << "token " << t;
      differs += std::fabs(want - exact) > 1e-4;
    }
    EXPECT_GT(differs, pr.T / 2) << "the rounding should show in most tokens' losses";
  }
}

// One token with x = (1, …): dW's first column is d logits itself, which must be the bf16 rounding
// of the float64 (softmax − onehot)·dloss of the rounded logits (within one bf16 step where the f32
// softmax and the float64 one straddle a rounding boundary), on the recompute and eager paths.
TEST(LmHeadBf16Logits, GradientIsTheRoundedGradientOfTheRoundedLogits) {
  Problem pr(1, 16, 40);
  pr.x[0] = 1.0f;
  const float dloss = 0.37f;
  const TokenRef want = token_ref(pr, 0, true, dloss);
  for (const OpTable* ops : all_tables()) {
    for (bool eager : {false, true}) {
      std::vector<float> dW(pr.V * pr.H, 0.0f), dx(pr.H), st(3);
      Tensor saved;
      const LmHeadProblem p = pr.head(true, pr.V, 0, eager ? &dloss : nullptr, eager ? dW.data() : nullptr);
      ops->lm_head_loss_forward(p, st.data(), st.data() + 1, st.data() + 2, &saved);
      const float lse = st[0] + std::log(st[1]);
      ops->lm_head_loss_backward(p, &lse, &dloss, dx.data(), dW.data(), &saved);
      int unrounded_differs = 0;
      for (int64_t v = 0; v < pr.V; ++v) {
        const float got = dW[v * pr.H], rounded = bf16_round(want.grad[v]);
        EXPECT_EQ(got, bf16_round(got)) << "d logit " << v << " is not a bf16 value";
        EXPECT_NEAR(got, rounded, std::ldexp(std::fabs(rounded), -7) + 1e-12) << "d logit " << v;
        unrounded_differs += static_cast<float>(want.grad[v]) != rounded;
      }
      EXPECT_GT(unrounded_differs, pr.V / 2);
    }
  }
}

// Every build, both paths and two vocabulary slices agree with the reference kernel under the flag;
// without it nothing is rounded (the exact logits' loss).
TEST(LmHeadBf16Logits, FusedBuildsSlicesAndPathsAgree) {
  const Problem pr(20, 16, 64);
  std::vector<float> dloss(pr.T);
  for (int64_t t = 0; t < pr.T; ++t) dloss[t] = (t % 4 == 0) ? 0.0f : 1.0f / pr.T;
  const OpTable ref = reference_ops();
  // Reference: whole vocabulary.
  std::vector<float> st_ref(3 * pr.T), lse(pr.T), dx_ref(pr.T * pr.H), dW_ref(pr.V * pr.H, 0.0f);
  Tensor saved_ref;
  const LmHeadProblem p_ref = pr.head(true, pr.V, 0);
  ref.lm_head_loss_forward(p_ref, st_ref.data(), st_ref.data() + pr.T, st_ref.data() + 2 * pr.T, &saved_ref);
  for (int64_t t = 0; t < pr.T; ++t) lse[t] = st_ref[t] + std::log(st_ref[pr.T + t]);
  ref.lm_head_loss_backward(p_ref, lse.data(), dloss.data(), dx_ref.data(), dW_ref.data(), &saved_ref);
  for (const OpTable* ops : all_tables()) {
    // Two vocabulary slices: merged statistics, summed dx, each slice's dW rows.
    std::vector<float> dx(pr.T * pr.H, 0.0f), dW(pr.V * pr.H, 0.0f);
    const int64_t Vl = pr.V / 2;
    for (int64_t r = 0; r < 2; ++r) {
      const LmHeadProblem p = pr.head(true, Vl, r * Vl);
      std::vector<float> st(3 * pr.T), dxr(pr.T * pr.H);
      Tensor kept;  // the reference keeps its logits; the fused head keeps nothing here and recomputes
      ops->lm_head_loss_forward(p, st.data(), st.data() + pr.T, st.data() + 2 * pr.T, &kept);
      ops->lm_head_loss_backward(p, lse.data(), dloss.data(), dxr.data(), dW.data() + r * Vl * pr.H, &kept);
      for (size_t i = 0; i < dx.size(); ++i) dx[i] += dxr[i];
    }
    EXPECT_LE(peak_rel_error(dx, dx_ref), 1e-4);
    EXPECT_LE(peak_rel_error(dW, dW_ref), 1e-4);
    // Eager, whole vocabulary.
    std::vector<float> st(3 * pr.T), dxe(pr.T * pr.H), dWe(pr.V * pr.H, 0.0f);
    Tensor saved;
    const LmHeadProblem pe = pr.head(true, pr.V, 0, dloss.data(), dWe.data());
    ops->lm_head_loss_forward(pe, st.data(), st.data() + pr.T, st.data() + 2 * pr.T, &saved);
    EXPECT_LE(peak_rel_error(st, st_ref), 1e-5);
    ops->lm_head_loss_backward(pe, lse.data(), dloss.data(), dxe.data(), dWe.data(), &saved);
    EXPECT_LE(peak_rel_error(dxe, dx_ref), 1e-4);
    EXPECT_LE(peak_rel_error(dWe, dW_ref), 1e-4);
  }
}

}  // namespace
}  // namespace gale
