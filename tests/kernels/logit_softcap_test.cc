// Gemma-2's logit soft-capping in the kernels (kernels/cpu/logit_softcap.h): attention scores
// (AttentionProblem::softcap) and LM-head logits (LmHeadProblem::logit_softcap). The reference
// attention against a float64 evaluation of the formula and against finite differences of its own
// forward; the flash kernels of every ISA and flash decoding against the reference; the LM head's
// loss against float64 and its gradients against finite differences; the fused LM head (recompute,
// eager and vocabulary-sliced paths) against the reference.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "fused_test_util.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/flash_decode.h"
#include "kernels/cpu/fused_ops.h"
#include "kernels/op_table.h"
#include "testing.h"

namespace gale {
namespace {

using testing::directional_derivative;
using testing::peak_rel_error;
using testing::random_vector;
using testing::runnable_isas;

// Queries [S·B, NH·HD], keys and values packed [S·B, KV, 2, HD] (as the flash tests lay them out).
struct Attn {
  int64_t B, S, NH, KV, HD;
  std::vector<float> q, kv;
  HeadLayout ql, kl, vl;
  Attn(int64_t b, int64_t s, int64_t nh, int64_t kvh, int64_t hd, float amp)
      : B(b), S(s), NH(nh), KV(kvh), HD(hd), q(random_vector(s * b * nh * hd, 501, amp)),
        kv(random_vector(s * b * 2 * kvh * hd, 502, amp)), ql(contiguous_heads_layout(nh, hd)),
        kl{2 * kvh * hd, 0, 1, 2 * hd, 0}, vl{2 * kvh * hd, hd, 1, 2 * hd, 0} {}
  AttentionProblem problem(float cap, float scale, int64_t window = 0) const {
    AttentionProblem p;
    p.B = B;
    p.Sq = p.Sk = S;
    p.NH = NH;
    p.KV = KV;
    p.HD = HD;
    p.scale = scale;
    p.softcap = cap;
    p.window = window;
    p.heads_total = NH;
    p.max_positions = S;
    return p;
  }
  int64_t out_n() const { return S * B * NH * HD; }
};

// Float64 forward of one (b, h, i): softmax over visible j of C·tanh(scale·q·k / C).
std::vector<double> formula_row(const Attn& a, const AttentionProblem& p, int64_t b, int64_t h, int64_t i) {
  const int64_t g = h / (a.NH / a.KV);
  std::vector<double> s(static_cast<size_t>(a.S), -INFINITY);
  double m = -INFINITY;
  for (int64_t j = 0; j <= i; ++j) {
    if (p.window > 0 && i - j >= p.window) continue;
    double d = 0.0;
    for (int64_t c = 0; c < a.HD; ++c)
      d += static_cast<double>(a.q[a.ql.offset(b, h) + i * a.B * a.ql.row_stride + c]) *
           a.kv[a.kl.offset(b, g) + j * a.B * a.kl.row_stride + c];
    d *= p.scale;
    s[j] = p.softcap > 0.0f ? p.softcap * std::tanh(d / p.softcap) : d;
    m = std::max(m, s[j]);
  }
  double l = 0.0;
  for (double x : s) l += std::isinf(x) ? 0.0 : std::exp(x - m);
  std::vector<double> out(static_cast<size_t>(a.HD), 0.0);
  for (int64_t j = 0; j <= i; ++j) {
    if (std::isinf(s[j])) continue;
    const double w = std::exp(s[j] - m) / l;
    for (int64_t c = 0; c < a.HD; ++c) out[c] += w * a.kv[a.vl.offset(b, g) + j * a.B * a.vl.row_stride + c];
  }
  return out;
}

// Scores of size ~±20 with a cap of 5: the cap changes every probability by far more than the tolerance.
TEST(AttentionSoftcap, ReferenceForwardIsTheFormula) {
  const Attn a(2, 9, 4, 2, 8, 2.5f);
  for (float cap : {0.0f, 5.0f}) {
    const AttentionProblem p = a.problem(cap, 0.9f, cap > 0.0f ? 4 : 0);
    std::vector<float> out(a.out_n()), lse(a.B * a.NH * a.S);
    attention_forward_ref(p, a.q.data(), a.ql, a.kv.data(), a.kl, a.kv.data(), a.vl, out.data(), lse.data());
    double err = 0.0, uncapped_gap = 0.0;
    AttentionProblem plain = p;
    plain.softcap = 0.0f;
    for (int64_t b = 0; b < a.B; ++b)
      for (int64_t h = 0; h < a.NH; ++h)
        for (int64_t i = 0; i < a.S; ++i) {
          const std::vector<double> want = formula_row(a, p, b, h, i), other = formula_row(a, plain, b, h, i);
          for (int64_t c = 0; c < a.HD; ++c) {
            err = std::max(err, std::fabs(out[(i * a.B + b) * a.NH * a.HD + h * a.HD + c] - want[c]));
            uncapped_gap = std::max(uncapped_gap, std::fabs(want[c] - other[c]));
          }
        }
    EXPECT_LT(err, 1e-5) << "cap " << cap;
    if (cap > 0.0f) {
      EXPECT_GT(uncapped_gap, 0.05) << "the cap must matter in this problem";
    }
  }
}

// d/dε of Σ dout·out(x + ε·dir) against the reference backward's dq, dk, dv.
TEST(AttentionSoftcap, ReferenceBackwardMatchesFiniteDifferences) {
  Attn a(2, 7, 4, 2, 6, 2.0f);
  const AttentionProblem p = a.problem(3.0f, 1.1f);
  const std::vector<float> dout = random_vector(a.out_n(), 503);
  std::vector<float> out(a.out_n()), lse(a.B * a.NH * a.S);
  auto loss = [&] {
    attention_forward_ref(p, a.q.data(), a.ql, a.kv.data(), a.kl, a.kv.data(), a.vl, out.data(), lse.data());
    double s = 0.0;
    for (int64_t i = 0; i < a.out_n(); ++i) s += static_cast<double>(out[i]) * dout[i];
    return s;
  };
  loss();
  std::vector<float> dq(a.q.size()), dkv(a.kv.size());
  attention_backward_ref(p, a.q.data(), a.ql, a.kv.data(), a.kl, a.kv.data(), a.vl, out.data(), lse.data(),
                         dout.data(), dq.data(), dkv.data(), dkv.data());
  for (int which = 0; which < 2; ++which) {
    std::vector<float>& x = which == 0 ? a.q : a.kv;
    const std::vector<float>& g = which == 0 ? dq : dkv;
    const std::vector<float> dir = random_vector(static_cast<int64_t>(x.size()), 504 + which);
    const double fd = directional_derivative(loss, x.data(), dir.data(), static_cast<int64_t>(x.size()), 1e-2);
    const double analytic = testing::dot(g.data(), dir.data(), static_cast<int64_t>(x.size()));
    EXPECT_NEAR(analytic, fd, 2e-3 * (1.0 + std::fabs(fd))) << (which == 0 ? "dq" : "dk/dv");
  }
}

struct CapCase {
  const char* name;
  int64_t B, S, NH, KV, HD, window;
  float dropout;
};

TEST(AttentionSoftcap, FlashKernelsMatchTheReference) {
  for (Isa isa : runnable_isas()) {
    const FusedKernelSet& f = *fused_kernel_set(isa);
    for (const CapCase& c : {CapCase{"causal", 2, 100, 4, 4, 16, 0, 0.0f}, CapCase{"gqa_window", 2, 130, 4, 2, 12, 37, 0.0f},
                             CapCase{"odd_dropout", 3, 19, 3, 1, 7, 0, 0.2f}, CapCase{"long", 1, 200, 2, 1, 64, 0, 0.0f}}) {
      SCOPED_TRACE(::testing::Message() << isa_name(isa) << " " << c.name);
      const Attn a(c.B, c.S, c.NH, c.KV, c.HD, 2.0f);
      AttentionProblem p = a.problem(4.0f, 1.0f / std::sqrt(static_cast<float>(c.HD)) * 3.0f, c.window);
      std::vector<int64_t> samples(c.B);
      for (int64_t b = 0; b < c.B; ++b) samples[b] = b;
      p.dropout_p = c.dropout;
      p.dropout_seed = 7;
      p.sample_ids = samples.data();
      std::vector<float> out_ref(a.out_n()), lse_ref(a.B * a.NH * a.S), out(a.out_n()), lse(lse_ref.size());
      attention_forward_ref(p, a.q.data(), a.ql, a.kv.data(), a.kl, a.kv.data(), a.vl, out_ref.data(), lse_ref.data());
      f.attention_forward(p, a.q.data(), a.ql, a.kv.data(), a.kl, a.kv.data(), a.vl, out.data(), lse.data());
      EXPECT_LE(peak_rel_error(out, out_ref), 2e-5);
      EXPECT_LE(peak_rel_error(lse, lse_ref), 2e-5);
      const std::vector<float> dout = random_vector(a.out_n(), 505);
      std::vector<float> dq_ref(a.q.size()), dkv_ref(a.kv.size()), dq(a.q.size()), dkv(a.kv.size());
      attention_backward_ref(p, a.q.data(), a.ql, a.kv.data(), a.kl, a.kv.data(), a.vl, out_ref.data(), lse_ref.data(),
                             dout.data(), dq_ref.data(), dkv_ref.data(), dkv_ref.data());
      f.attention_backward(p, a.q.data(), a.ql, a.kv.data(), a.kl, a.kv.data(), a.vl, out_ref.data(), lse_ref.data(),
                           dout.data(), dq.data(), dkv.data(), dkv.data());
      EXPECT_LE(peak_rel_error(dq, dq_ref, 1.0), 2e-5);
      EXPECT_LE(peak_rel_error(dkv, dkv_ref, 1.0), 2e-5);
    }
  }
}

// One decoding query over L cached keys: flash decoding (every chunk size) equals the reference
// attention of that query, capped.
TEST(AttentionSoftcap, FlashDecodingMatchesTheReference) {
  const int64_t L = 77, NH = 4, KV = 2, HD = 8;
  const Attn a(1, L, NH, KV, HD, 2.5f);
  AttentionProblem full = a.problem(2.0f, 0.8f);
  std::vector<float> out_ref(a.out_n()), lse_ref(NH * L);
  attention_forward_ref(full, a.q.data(), a.ql, a.kv.data(), a.kl, a.kv.data(), a.vl, out_ref.data(), lse_ref.data());
  const int32_t qpos = static_cast<int32_t>(L - 1);
  AttentionProblem p = full;
  p.Sq = 1;
  p.q_positions = &qpos;
  const float* q = a.q.data() + (L - 1) * NH * HD;
  for (int64_t chunk : {int64_t{1}, int64_t{7}, L}) {
    std::vector<float> out(NH * HD), lse(NH);
    flash_decode_forward(p, q, a.ql, a.kv.data(), a.kl, a.kv.data(), a.vl, chunk, out.data(), lse.data());
    for (int64_t h = 0; h < NH; ++h) {
      EXPECT_NEAR(lse[h], lse_ref[h * L + L - 1], 2e-5) << "chunk " << chunk;
      for (int64_t c = 0; c < HD; ++c)
        EXPECT_NEAR(out[h * HD + c], out_ref[(L - 1) * NH * HD + h * HD + c], 2e-5) << "chunk " << chunk;
    }
  }
}

// ---- LM head ----

struct Head {
  int64_t T, H, V;
  std::vector<float> x, W;
  std::vector<int32_t> targets;
  Head(int64_t t, int64_t h, int64_t v) : T(t), H(h), V(v), x(random_vector(t * h, 511, 2.0f)),
                                          W(random_vector(v * h, 512, 1.5f)), targets(t) {
    for (int64_t i = 0; i < T; ++i) targets[i] = static_cast<int32_t>((i * 13 + 5) % V);
  }
  LmHeadProblem problem(float cap, int64_t Vl = 0, int64_t start = 0, const float* dloss = nullptr,
                        float* dW = nullptr) const {
    if (Vl == 0) Vl = V;
    LmHeadProblem p{T, H, Vl, start, x.data(), W.data() + start * H, targets.data(), Vl == V, dloss, dW};
    p.logit_softcap = cap;
    return p;
  }
};

double token_loss(const std::vector<float>& st, int64_t T, int64_t t) {
  return static_cast<double>(st[t]) + std::log(static_cast<double>(st[T + t])) - st[2 * T + t];
}

TEST(LmHeadSoftcap, LossIsTheCrossEntropyOfTheCappedLogits) {
  const Head hd(6, 8, 30);  // logits up to ~±20, cap 6
  const OpTable ref = reference_ops();
  std::vector<float> st(3 * hd.T);
  ref.lm_head_loss_forward(hd.problem(6.0f), st.data(), st.data() + hd.T, st.data() + 2 * hd.T, nullptr);
  for (int64_t t = 0; t < hd.T; ++t) {
    std::vector<double> l(static_cast<size_t>(hd.V));
    double m = -INFINITY;
    for (int64_t v = 0; v < hd.V; ++v) {
      double z = 0.0;
      for (int64_t k = 0; k < hd.H; ++k) z += static_cast<double>(hd.x[t * hd.H + k]) * hd.W[v * hd.H + k];
      l[v] = 6.0 * std::tanh(z / 6.0);
      m = std::max(m, l[v]);
    }
    double se = 0.0;
    for (double e : l) se += std::exp(e - m);
    const double want = m + std::log(se) - l[hd.targets[t]];
    EXPECT_NEAR(token_loss(st, hd.T, t), want, 1e-5 * (1.0 + std::fabs(want))) << "token " << t;
  }
}

// Σ_t dloss_t·loss_t: its derivative along random directions of x and W against dx and dW.
TEST(LmHeadSoftcap, ReferenceGradientsMatchFiniteDifferences) {
  Head hd(5, 6, 40);
  const OpTable ref = reference_ops();
  std::vector<float> dloss(hd.T);
  for (int64_t t = 0; t < hd.T; ++t) dloss[t] = 0.3f + 0.1f * static_cast<float>(t);
  auto loss = [&] {
    std::vector<float> st(3 * hd.T);
    ref.lm_head_loss_forward(hd.problem(4.0f), st.data(), st.data() + hd.T, st.data() + 2 * hd.T, nullptr);
    double s = 0.0;
    for (int64_t t = 0; t < hd.T; ++t) s += dloss[t] * token_loss(st, hd.T, t);
    return s;
  };
  std::vector<float> st(3 * hd.T), lse(hd.T), dx(hd.T * hd.H), dW(hd.V * hd.H, 0.0f);
  Tensor saved;
  const LmHeadProblem p = hd.problem(4.0f);
  ref.lm_head_loss_forward(p, st.data(), st.data() + hd.T, st.data() + 2 * hd.T, &saved);
  for (int64_t t = 0; t < hd.T; ++t) lse[t] = st[t] + std::log(st[hd.T + t]);
  ref.lm_head_loss_backward(p, lse.data(), dloss.data(), dx.data(), dW.data(), &saved);
  for (int which = 0; which < 2; ++which) {
    std::vector<float>& x = which == 0 ? hd.x : hd.W;
    const std::vector<float>& g = which == 0 ? dx : dW;
    const std::vector<float> dir = random_vector(static_cast<int64_t>(x.size()), 513 + which);
    const double fd = directional_derivative(loss, x.data(), dir.data(), static_cast<int64_t>(x.size()), 1e-2);
    EXPECT_NEAR(testing::dot(g.data(), dir.data(), static_cast<int64_t>(x.size())), fd, 2e-3 * (1.0 + std::fabs(fd)))
        << (which == 0 ? "dx" : "dW");
  }
}

TEST(LmHeadSoftcap, FusedPathsMatchTheReference) {
  const OpTable ref = reference_ops();
  const Head hd(37, 24, 1000);
  std::vector<float> dloss(hd.T);
  for (int64_t t = 0; t < hd.T; ++t) dloss[t] = (t % 4 == 0) ? 0.0f : 1.0f / static_cast<float>(hd.T);
  for (Isa isa : runnable_isas()) {
    OpTable f = reference_ops();
    ASSERT_TRUE(install_all_fused_kernels(f, isa).ok());
    for (int64_t slices : {int64_t{1}, int64_t{4}}) {
      SCOPED_TRACE(::testing::Message() << isa_name(isa) << " slices " << slices);
      const int64_t Vl = hd.V / slices;
      for (int64_t s = 0; s < slices; ++s) {
        const LmHeadProblem p = hd.problem(5.0f, Vl, s * Vl);
        std::vector<float> st_ref(3 * hd.T), st(3 * hd.T);
        Tensor saved_ref, saved;
        ref.lm_head_loss_forward(p, st_ref.data(), st_ref.data() + hd.T, st_ref.data() + 2 * hd.T, &saved_ref);
        f.lm_head_loss_forward(p, st.data(), st.data() + hd.T, st.data() + 2 * hd.T, &saved);
        EXPECT_LE(peak_rel_error(st, st_ref), 1e-5);
        std::vector<float> lse(hd.T);
        for (int64_t t = 0; t < hd.T; ++t) lse[t] = st_ref[t] + std::log(st_ref[hd.T + t]) + 0.2f;
        std::vector<float> dx_ref(hd.T * hd.H), dx(dx_ref.size()), dW_ref(Vl * hd.H, 0.0f), dW(dW_ref.size(), 0.0f);
        ref.lm_head_loss_backward(p, lse.data(), dloss.data(), dx_ref.data(), dW_ref.data(), &saved_ref);
        f.lm_head_loss_backward(p, lse.data(), dloss.data(), dx.data(), dW.data(), &saved);
        EXPECT_LE(peak_rel_error(dx, dx_ref), 1e-5);
        EXPECT_LE(peak_rel_error(dW, dW_ref), 1e-5);
      }
    }
    // Eager: the whole backward inside forward.
    std::vector<float> st_ref(3 * hd.T), lse(hd.T), dx_ref(hd.T * hd.H), dW_ref(hd.V * hd.H, 0.0f);
    Tensor saved_ref;
    const LmHeadProblem pr = hd.problem(5.0f);
    ref.lm_head_loss_forward(pr, st_ref.data(), st_ref.data() + hd.T, st_ref.data() + 2 * hd.T, &saved_ref);
    for (int64_t t = 0; t < hd.T; ++t) lse[t] = st_ref[t] + std::log(st_ref[hd.T + t]);
    ref.lm_head_loss_backward(pr, lse.data(), dloss.data(), dx_ref.data(), dW_ref.data(), &saved_ref);
    std::vector<float> st(3 * hd.T), dx(hd.T * hd.H), dW(hd.V * hd.H, 0.0f);
    const LmHeadProblem pe = hd.problem(5.0f, hd.V, 0, dloss.data(), dW.data());
    Tensor saved;
    f.lm_head_loss_forward(pe, st.data(), st.data() + hd.T, st.data() + 2 * hd.T, &saved);
    f.lm_head_loss_backward(pe, lse.data(), dloss.data(), dx.data(), dW.data(), &saved);
    EXPECT_LE(peak_rel_error(dx, dx_ref), 1e-5) << isa_name(isa) << " eager";
    EXPECT_LE(peak_rel_error(dW, dW_ref), 1e-5) << isa_name(isa) << " eager";
  }
}

}  // namespace
}  // namespace gale
