// Finite-difference checks of every reference kernel's backward against its forward.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/op_table.h"
#include "testing.h"

namespace gale {
namespace {

using testing::directional_derivative;
using testing::dot;
using testing::random_vector;
using testing::rel_diff;

// Checks d/dε Σ r·f(x + ε·dir) == Σ dir·∂x for a kernel whose backward gives ∂x from dy = r.
// The objective is accumulated in double; eps is chosen for fp32 forward passes.
constexpr double kEps = 1e-2;
constexpr double kTol = 2e-3;

TEST(NormGrad, LayerNorm) {
  const int64_t rows = 7, H = 33;
  auto x = random_vector(rows * H, 1, 2.0f), w = random_vector(H, 2), b = random_vector(H, 3);
  auto r = random_vector(rows * H, 4);
  std::vector<float> y(rows * H), mean(rows), rstd(rows), dx(rows * H), dw(H, 0.0f), db(H, 0.0f);
  auto loss = [&] {
    layernorm_forward_ref(x.data(), w.data(), b.data(), y.data(), mean.data(), rstd.data(), rows, H, 1e-5f);
    return dot(y.data(), r.data(), rows * H);
  };
  loss();
  layernorm_backward_ref(r.data(), x.data(), w.data(), mean.data(), rstd.data(), dx.data(), dw.data(), db.data(), rows, H);
  for (auto* target : {&x, &w, &b}) {
    std::vector<float>& t = *target;
    auto dir = random_vector(static_cast<int64_t>(t.size()), 9);
    const std::vector<float>& g = target == &x ? dx : target == &w ? dw : db;
    double analytic = dot(g.data(), dir.data(), static_cast<int64_t>(t.size()));
    double numeric = directional_derivative(loss, t.data(), dir.data(), static_cast<int64_t>(t.size()), kEps);
    EXPECT_LT(rel_diff(analytic, numeric), kTol) << analytic << " vs " << numeric;
  }
}

TEST(NormGrad, RMSNorm) {
  const int64_t rows = 5, H = 48;
  auto x = random_vector(rows * H, 11, 2.0f), w = random_vector(H, 12);
  auto r = random_vector(rows * H, 13);
  std::vector<float> y(rows * H), rstd(rows), dx(rows * H), dw(H, 0.0f);
  auto loss = [&] {
    rmsnorm_forward_ref(x.data(), w.data(), y.data(), rstd.data(), rows, H, 1e-5f);
    return dot(y.data(), r.data(), rows * H);
  };
  loss();
  rmsnorm_backward_ref(r.data(), x.data(), w.data(), rstd.data(), dx.data(), dw.data(), rows, H);
  auto dir = random_vector(rows * H, 14);
  EXPECT_LT(rel_diff(dot(dx.data(), dir.data(), rows * H), directional_derivative(loss, x.data(), dir.data(), rows * H, kEps)), kTol);
  auto dirw = random_vector(H, 15);
  EXPECT_LT(rel_diff(dot(dw.data(), dirw.data(), H), directional_derivative(loss, w.data(), dirw.data(), H, kEps)), kTol);
}

TEST(NormGrad, BackwardAccumulatesWeightGrads) {
  const int64_t rows = 3, H = 8;
  auto x = random_vector(rows * H, 1), w = random_vector(H, 2), dy = random_vector(rows * H, 3);
  std::vector<float> y(rows * H), rstd(rows), dx(rows * H), dw1(H, 0.0f), dw2(H, 0.0f);
  rmsnorm_forward_ref(x.data(), w.data(), y.data(), rstd.data(), rows, H, 1e-5f);
  rmsnorm_backward_ref(dy.data(), x.data(), w.data(), rstd.data(), dx.data(), dw1.data(), rows, H);
  rmsnorm_backward_ref(dy.data(), x.data(), w.data(), rstd.data(), dx.data(), dw2.data(), rows, H);
  rmsnorm_backward_ref(dy.data(), x.data(), w.data(), rstd.data(), dx.data(), dw2.data(), rows, H);
  for (int64_t i = 0; i < H; ++i) EXPECT_NEAR(dw2[i], 2.0f * dw1[i], 1e-5f);
}

TEST(ActivationGrad, Gelu) {
  const int64_t n = 301;
  auto x = random_vector(n, 21, 4.0f), r = random_vector(n, 22);
  std::vector<float> y(n), dx(n);
  auto loss = [&] {
    gelu_forward_ref(x.data(), y.data(), n);
    return dot(y.data(), r.data(), n);
  };
  gelu_backward_ref(r.data(), x.data(), dx.data(), n);
  auto dir = random_vector(n, 23);
  EXPECT_LT(rel_diff(dot(dx.data(), dir.data(), n), directional_derivative(loss, x.data(), dir.data(), n, 1e-3)), kTol);
  // Exact erf GeLU at known points.
  float pts[3] = {-1.0f, 0.0f, 2.0f}, out[3];
  gelu_forward_ref(pts, out, 3);
  EXPECT_NEAR(out[0], -0.15865525f, 1e-6f);
  EXPECT_EQ(out[1], 0.0f);
  EXPECT_NEAR(out[2], 1.95449974f, 1e-6f);
}

// --openai-gelu: finite differences, and torch's gelu(approximate="tanh") at known points.
TEST(ActivationGrad, GeluTanh) {
  const int64_t n = 301;
  auto x = random_vector(n, 24, 4.0f), r = random_vector(n, 25);
  std::vector<float> y(n), dx(n);
  auto loss = [&] {
    gelu_tanh_forward_ref(x.data(), y.data(), n);
    return dot(y.data(), r.data(), n);
  };
  gelu_tanh_backward_ref(r.data(), x.data(), dx.data(), n);
  auto dir = random_vector(n, 26);
  EXPECT_LT(rel_diff(dot(dx.data(), dir.data(), n), directional_derivative(loss, x.data(), dir.data(), n, 1e-3)), kTol);
  float pts[3] = {-1.0f, 0.0f, 2.0f}, out[3];
  gelu_tanh_forward_ref(pts, out, 3);
  EXPECT_NEAR(out[0], -0.15880801f, 1e-6f);
  EXPECT_EQ(out[1], 0.0f);
  EXPECT_NEAR(out[2], 1.95459769f, 1e-6f);
}

// --squared-relu: finite differences (points away from the kink at 0), and the formula at known points.
TEST(ActivationGrad, SquaredRelu) {
  const int64_t n = 301;
  auto x = random_vector(n, 27, 4.0f), r = random_vector(n, 28);
  for (float& v : x)
    if (std::fabs(v) < 0.05f) v += 0.1f;  // the step h of the finite difference must not cross 0
  std::vector<float> y(n), dx(n);
  auto loss = [&] {
    squared_relu_forward_ref(x.data(), y.data(), n);
    return dot(y.data(), r.data(), n);
  };
  squared_relu_backward_ref(r.data(), x.data(), dx.data(), n);
  auto dir = random_vector(n, 29);
  EXPECT_LT(rel_diff(dot(dx.data(), dir.data(), n), directional_derivative(loss, x.data(), dir.data(), n, 1e-3)), kTol);
  float pts[3] = {-1.5f, 0.0f, 3.0f}, out[3], dy[3] = {1.0f, 1.0f, 0.5f}, grad[3];
  squared_relu_forward_ref(pts, out, 3);
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[1], 0.0f);
  EXPECT_EQ(out[2], 9.0f);
  squared_relu_backward_ref(dy, pts, grad, 3);
  EXPECT_EQ(grad[0], 0.0f);
  EXPECT_EQ(grad[1], 0.0f);
  EXPECT_EQ(grad[2], 3.0f);  // 0.5 · 2 · 3
}

TEST(ActivationGrad, SwiGLU) {
  const int64_t rows = 4, F = 19;
  auto x = random_vector(rows * 2 * F, 31, 3.0f), r = random_vector(rows * F, 32);
  std::vector<float> y(rows * F), dx(rows * 2 * F);
  auto loss = [&] {
    swiglu_forward_ref(x.data(), y.data(), rows, F);
    return dot(y.data(), r.data(), rows * F);
  };
  swiglu_backward_ref(r.data(), x.data(), dx.data(), rows, F);
  auto dir = random_vector(rows * 2 * F, 33);
  EXPECT_LT(rel_diff(dot(dx.data(), dir.data(), rows * 2 * F),
                     directional_derivative(loss, x.data(), dir.data(), rows * 2 * F, 1e-3)), kTol);
}

// The gated activation of --quick-geglu / --glu-linear-offset / --activation-func-clamp-value: the
// finite difference sees the clamp's flat regions (inputs of scale 5 against clamp 2.5, none within
// 0.05 of a kink so that ±eps stays on one side), and an entry past the clamp has a zero gradient.
TEST(ActivationGrad, GluQuickGeluOffsetAndClamp) {
  const int64_t rows = 4, F = 23;
  for (const GluSpec& spec : {GluSpec{kQuickGeluAlpha, 1.0f, 2.5f}, GluSpec{kQuickGeluAlpha, 0.0f, HUGE_VALF},
                              GluSpec{1.0f, 0.0f, 2.5f}, GluSpec{1.0f, -0.75f, HUGE_VALF}}) {
    SCOPED_TRACE(::testing::Message() << "alpha " << spec.alpha << " offset " << spec.linear_offset << " clamp "
                                      << spec.clamp);
    auto x = random_vector(rows * 2 * F, 34, 5.0f), r = random_vector(rows * F, 35);
    for (float& v : x)
      for (float kink : {spec.clamp, -spec.clamp})
        if (std::fabs(v - kink) < 0.05f) v = kink + (v < kink ? -0.05f : 0.05f);
    std::vector<float> y(rows * F), dx(rows * 2 * F);
    auto loss = [&] {
      glu_forward_ref(spec, x.data(), y.data(), rows, F);
      return dot(y.data(), r.data(), rows * F);
    };
    glu_backward_ref(spec, r.data(), x.data(), dx.data(), rows, F);
    auto dir = random_vector(rows * 2 * F, 36);
    // Five-point stencil, h = 0.01 (2h stays inside the 0.05 margin): inputs of scale 5 make the
    // central difference's fp32 noise too large at h = 1e-3.
    EXPECT_LT(rel_diff(dot(dx.data(), dir.data(), rows * 2 * F),
                       testing::directional_derivative_5point(loss, x.data(), dir.data(), rows * 2 * F, 1e-2)),
              kTol);
    int64_t clamped = 0;
    for (int64_t row = 0; row < rows; ++row)
      for (int64_t i = 0; i < F; ++i) {
        const int64_t g = row * 2 * F + i, l = g + F;
        if (x[g] > spec.clamp) {
          EXPECT_EQ(dx[g], 0.0f) << "gate past the clamp at " << g;
          ++clamped;
        }
        if (std::fabs(x[l]) > spec.clamp) {
          EXPECT_EQ(dx[l], 0.0f) << "linear half past the clamp at " << l;
          ++clamped;
        }
      }
    if (std::isfinite(spec.clamp)) {
      EXPECT_GT(clamped, 10);  // the inputs do reach past the clamp
    }
  }
  // alpha 1, no offset, no clamp is SwiGLU (within a rounding: the compiler may contract differently).
  const int64_t n = 3 * 2 * 9;
  auto x = random_vector(n, 37, 4.0f), dy = random_vector(n / 2, 38);
  std::vector<float> y(n / 2), y_swiglu(n / 2), dx(n), dx_swiglu(n);
  glu_forward_ref(GluSpec{}, x.data(), y.data(), 3, 9);
  swiglu_forward_ref(x.data(), y_swiglu.data(), 3, 9);
  glu_backward_ref(GluSpec{}, dy.data(), x.data(), dx.data(), 3, 9);
  swiglu_backward_ref(dy.data(), x.data(), dx_swiglu.data(), 3, 9);
  for (int64_t i = 0; i < n / 2; ++i) EXPECT_NEAR(y[i], y_swiglu[i], 1e-6f * std::max(1.0f, std::fabs(y_swiglu[i])));
  for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(dx[i], dx_swiglu[i], 1e-6f * std::max(1.0f, std::fabs(dx_swiglu[i])));
}

TEST(RopeGrad, BackwardIsTransposeAndPreservesNorm) {
  const int64_t S = 6, B = 2, NH = 3, KV = 1, HD = 8;
  const int64_t row = (NH + 2 * KV) * HD;
  auto x = random_vector(S * B * row, 41), r = random_vector(S * B * row, 42);
  std::vector<int32_t> pos(B * S);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s) pos[b * S + s] = static_cast<int32_t>(s + 3 * b);
  RopeTables tables = make_rope_tables(32, 6, 10000.0);  // rotary_percent 0.75
  HeadLayout ql = qkv_query_layout(NH, KV, HD);
  std::vector<float> y = x;
  rope_forward_ref(y.data(), ql, NH, S, B, HD, pos.data(), tables);
  // <R x, r> == <x, Rᵀ r>
  std::vector<float> rt = r;
  rope_backward_ref(rt.data(), ql, NH, S, B, HD, pos.data(), tables);
  EXPECT_LT(rel_diff(dot(y.data(), r.data(), S * B * row), dot(x.data(), rt.data(), S * B * row)), 1e-5);
  // A rotation keeps the norm, and the key/value columns are untouched.
  EXPECT_LT(rel_diff(dot(y.data(), y.data(), S * B * row), dot(x.data(), x.data(), S * B * row)), 1e-5);
  HeadLayout kl = qkv_key_layout(NH, KV, HD);
  for (int64_t t = 0; t < S * B; ++t)
    for (int64_t c = 0; c < 2 * HD; ++c) EXPECT_EQ(y[kl.offset(t, 0) + c], x[kl.offset(t, 0) + c]);
  // Position 0 is the identity.
  std::vector<int32_t> zeros(B * S, 0);
  std::vector<float> z = x;
  rope_forward_ref(z.data(), ql, NH, S, B, HD, zeros.data(), tables);
  EXPECT_EQ(z, x);
}

// --rotary-interleaved as Megatron writes it: emb = [θ0, θ0, θ1, θ1, ...], rotate_half(x) pairs
// (−x[2i+1], x[2i]), out = x·cos(emb) + rotate_half(x)·sin(emb) on the first R dims; the rest pass
// through. Also: it is the rotate-half kernel on the dims reordered evens-then-odds.
TEST(RopeGrad, InterleavedPairsAsMegatron) {
  const int64_t S = 5, B = 2, NH = 2, KV = 1, HD = 8, R = 6;
  const int64_t row = (NH + 2 * KV) * HD;
  auto x = random_vector(S * B * row, 43);
  std::vector<int32_t> pos(B * S);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s) pos[b * S + s] = static_cast<int32_t>(2 * s + b);
  RopeTables tables = make_rope_tables(32, R, 10000.0);
  tables.interleaved = true;
  const HeadLayout ql = qkv_query_layout(NH, KV, HD);
  std::vector<float> y = x;
  rope_forward_ref(y.data(), ql, NH, S, B, HD, pos.data(), tables);
  RopeTables halves = make_rope_tables(32, R, 10000.0);
  for (int64_t t = 0; t < S * B; ++t) {
    const double p = pos[(t % B) * S + t / B];
    for (int64_t h = 0; h < NH; ++h) {
      const float* in = x.data() + ql.offset(t, h);
      const float* out = y.data() + ql.offset(t, h);
      for (int64_t d = 0; d < HD; ++d) {
        if (d >= R) {
          EXPECT_EQ(out[d], in[d]);
          continue;
        }
        const double theta = p * std::pow(10000.0, -2.0 * static_cast<double>(d / 2) / static_cast<double>(R));
        const double rotated = d % 2 == 0 ? -in[d + 1] : in[d - 1];
        EXPECT_NEAR(out[d], in[d] * std::cos(theta) + rotated * std::sin(theta), 1e-5) << t << " " << h << " " << d;
      }
      // The same head reordered [x0, x2, x4, x1, x3, x5, x6, x7] through the rotate-half kernel.
      std::vector<float> perm(static_cast<size_t>(HD)), done(static_cast<size_t>(HD));
      for (int64_t i = 0; i < R / 2; ++i) {
        perm[i] = in[2 * i];
        perm[i + R / 2] = in[2 * i + 1];
      }
      for (int64_t d = R; d < HD; ++d) perm[d] = in[d];
      const int32_t one_pos = static_cast<int32_t>(p);
      rope_forward_ref(perm.data(), contiguous_heads_layout(1, HD), 1, 1, 1, HD, &one_pos, halves);
      for (int64_t i = 0; i < R / 2; ++i) {
        EXPECT_EQ(out[2 * i], perm[i]);
        EXPECT_EQ(out[2 * i + 1], perm[i + R / 2]);
      }
    }
  }
  // Backward is the transpose.
  auto r = random_vector(S * B * row, 44);
  std::vector<float> rt = r;
  rope_backward_ref(rt.data(), ql, NH, S, B, HD, pos.data(), tables);
  EXPECT_LT(rel_diff(dot(y.data(), r.data(), S * B * row), dot(x.data(), rt.data(), S * B * row)), 1e-5);
}

struct AttnCase {
  int64_t B, S, NH, KV, HD;
  bool docs;
  float dropout;
  int64_t window = 0;
  bool alibi = false;
  int sink = 0;  // --softmax-type: 0 vanilla, 1 off-by-one (zero logits), 2 learnable (these logits)
};

class AttentionGrad : public ::testing::TestWithParam<AttnCase> {};

TEST_P(AttentionGrad, MatchesFiniteDifferences) {
  const AttnCase c = GetParam();
  const int64_t row = (c.NH + 2 * c.KV) * c.HD, T = c.S * c.B;
  auto qkv = random_vector(T * row, 51, 1.5f), r = random_vector(T * c.NH * c.HD, 52);
  std::vector<int32_t> docs(c.B * c.S);
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t s = 0; s < c.S; ++s) docs[b * c.S + s] = static_cast<int32_t>(s >= 3 + b);
  std::vector<int64_t> samples(c.B);
  for (int64_t b = 0; b < c.B; ++b) samples[b] = 10 + b;
  AttentionProblem p;
  p.B = c.B;
  p.Sq = p.Sk = c.S;
  p.NH = c.NH;
  p.KV = c.KV;
  p.HD = c.HD;
  p.scale = 1.0f / std::sqrt(static_cast<float>(c.HD));
  if (c.docs) p.q_doc_ids = p.k_doc_ids = docs.data();
  p.window = c.window;
  p.dropout_p = c.dropout;
  p.dropout_seed = 7;
  p.dropout_stream = 3;
  p.sample_ids = samples.data();
  p.heads_total = c.NH;
  p.max_positions = c.S;
  const std::vector<float> slopes = alibi_slopes(c.NH);
  if (c.alibi) p.alibi_slopes = slopes.data();
  std::vector<float> sinks(static_cast<size_t>(c.NH), 0.0f);
  if (c.sink == 2)
    for (int64_t h = 0; h < c.NH; ++h) sinks[h] = -1.0f + 1.25f * static_cast<float>(h);
  if (c.sink) p.softmax_offset = sinks.data();
  HeadLayout ql = qkv_query_layout(c.NH, c.KV, c.HD), kl = qkv_key_layout(c.NH, c.KV, c.HD),
             vl = qkv_value_layout(c.NH, c.KV, c.HD);
  std::vector<float> out(T * c.NH * c.HD), lse(c.B * c.NH * c.S), dqkv(T * row, 123.0f);
  auto loss = [&] {
    attention_forward_ref(p, qkv.data(), ql, qkv.data(), kl, qkv.data(), vl, out.data(), lse.data());
    return dot(out.data(), r.data(), static_cast<int64_t>(out.size()));
  };
  loss();
  attention_backward_ref(p, qkv.data(), ql, qkv.data(), kl, qkv.data(), vl, out.data(), lse.data(), r.data(),
                         dqkv.data(), dqkv.data(), dqkv.data());
  std::vector<float> d_sinks(static_cast<size_t>(c.NH), 0.5f);  // accumulates
  attention_softmax_offset_backward(p, out.data(), r.data(), lse.data(), d_sinks.data());
  auto dir = random_vector(T * row, 53);
  double analytic = dot(dqkv.data(), dir.data(), T * row);
  double numeric = directional_derivative(loss, qkv.data(), dir.data(), T * row, 1e-3);
  EXPECT_LT(rel_diff(analytic, numeric), 3e-3) << analytic << " vs " << numeric;
  if (c.sink) {  // the sink logits' gradient, one head at a time
    for (int64_t h = 0; h < c.NH; ++h) {
      std::vector<float> e(static_cast<size_t>(c.NH), 0.0f);
      e[h] = 1.0f;
      const double d_numeric = directional_derivative(loss, sinks.data(), e.data(), c.NH, 1e-3);
      EXPECT_LT(std::fabs(d_sinks[h] - 0.5f - d_numeric), 3e-3 * std::max(1.0, std::fabs(d_numeric)))
          << "head " << h << ": " << d_sinks[h] - 0.5f << " vs " << d_numeric;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionGrad,
                         ::testing::Values(AttnCase{2, 7, 2, 2, 4, false, 0.0f}, AttnCase{1, 9, 4, 2, 8, false, 0.0f},
                                           AttnCase{2, 8, 4, 1, 4, true, 0.0f}, AttnCase{2, 6, 2, 1, 4, false, 0.3f},
                                           AttnCase{2, 9, 4, 2, 4, false, 0.0f, 3},   // sliding window
                                           AttnCase{2, 8, 4, 1, 4, true, 0.0f, 2},    // window + documents
                                           AttnCase{1, 7, 2, 2, 4, false, 0.3f, 4},   // window + dropout
                                           AttnCase{1, 6, 2, 1, 4, false, 0.0f, 1},   // only itself
                                           AttnCase{2, 9, 4, 2, 4, false, 0.0f, 0, true},  // ALiBi + GQA
                                           AttnCase{2, 8, 3, 3, 4, true, 0.0f, 3, true},   // ALiBi + docs + window
                                           AttnCase{1, 7, 2, 1, 4, false, 0.3f, 0, true},  // ALiBi + dropout
                                           // --softmax-type off-by-one / learnable sinks
                                           AttnCase{2, 7, 2, 2, 4, false, 0.0f, 0, false, 1},
                                           AttnCase{2, 8, 4, 1, 4, true, 0.0f, 0, false, 2},   // GQA + docs
                                           AttnCase{2, 6, 2, 1, 4, false, 0.3f, 0, false, 2},  // dropout
                                           AttnCase{2, 9, 4, 2, 4, false, 0.0f, 3, true, 2}));  // window + ALiBi

// --softmax-type: a query that sees one key s with value v gets v·e^s / (e^σ + e^s) (Evan Miller's
// softmax_1 at σ = 0), lse = log(e^σ + e^s); one that sees no key gets 0 and lse σ.
TEST(Attention, SoftmaxOffsetIsOneMoreLogitWithoutValue) {
  const int64_t HD = 4;
  // Two samples of one position each; sample 1's query is in another document than its key.
  std::vector<float> qkv = {0.5f, -1.0f, 0.25f, 2.0f, 1.0f, 0.5f, -0.5f, 1.5f, 3.0f, -2.0f, 1.0f, 0.5f,
                            0.1f, 0.2f, 0.3f, 0.4f, 0.4f, 0.3f, 0.2f, 0.1f, 1.0f, 1.0f, 1.0f, 1.0f};
  const std::vector<int32_t> q_docs = {0, 1}, k_docs = {0, 2};
  AttentionProblem p;
  p.B = 2;
  p.Sq = p.Sk = 1;
  p.NH = p.KV = 1;
  p.HD = HD;
  p.scale = 0.5f;
  p.q_doc_ids = q_docs.data();
  p.k_doc_ids = k_docs.data();
  for (const float sink : {0.0f, 1.5f}) {
    p.softmax_offset = &sink;
    std::vector<float> out(2 * HD), lse(2);
    attention_forward_ref(p, qkv.data(), qkv_query_layout(1, 1, HD), qkv.data(), qkv_key_layout(1, 1, HD), qkv.data(),
                          qkv_value_layout(1, 1, HD), out.data(), lse.data());
    double s = 0.0;
    for (int64_t c = 0; c < HD; ++c) s += 0.5 * qkv[c] * qkv[HD + c];
    const double w = std::exp(s) / (std::exp(double{sink}) + std::exp(s));
    for (int64_t c = 0; c < HD; ++c) EXPECT_NEAR(out[c], w * qkv[2 * HD + c], 1e-6) << sink;
    EXPECT_NEAR(lse[0], std::log(std::exp(double{sink}) + std::exp(s)), 1e-6);
    for (int64_t c = 0; c < HD; ++c) EXPECT_EQ(out[HD + c], 0.0f);  // sample 1 sees no key
    EXPECT_EQ(lse[1], sink);
  }
}

// Press et al.'s / MindSpeed's slopes (tools/reference/alibi_slopes_reference.py), Bloom's rule up
// to float32 rounding: powers of two, and the interleaved extra slopes of 12 and 20 heads.
TEST(Attention, AlibiSlopesMatchReference) {
  const std::vector<std::vector<float>> expected = {
  // NH = 1 (Bloom's float32 rule differs by at most 0)
  {3.906250000e-03f},
  // NH = 8 (Bloom's float32 rule differs by at most 0)
  {5.000000000e-01f, 2.500000000e-01f, 1.250000000e-01f, 6.250000000e-02f, 3.125000000e-02f, 1.562500000e-02f, 7.812500000e-03f, 3.906250000e-03f},
  // NH = 12 (Bloom's float32 rule differs by at most 1.49e-08)
  {5.000000000e-01f, 2.500000000e-01f, 1.250000000e-01f, 6.250000000e-02f, 3.125000000e-02f, 1.562500000e-02f, 7.812500000e-03f, 3.906250000e-03f, 7.071067691e-01f, 3.535533845e-01f, 1.767766923e-01f, 8.838834614e-02f},
  // NH = 16 (Bloom's float32 rule differs by at most 2.98e-08)
  {7.071067691e-01f, 5.000000000e-01f, 3.535533845e-01f, 2.500000000e-01f, 1.767766923e-01f, 1.250000000e-01f, 8.838834614e-02f, 6.250000000e-02f, 4.419417307e-02f, 3.125000000e-02f, 2.209708653e-02f, 1.562500000e-02f, 1.104854327e-02f, 7.812500000e-03f, 5.524271633e-03f, 3.906250000e-03f},
  // NH = 20 (Bloom's float32 rule differs by at most 5.96e-08)
  {7.071067691e-01f, 5.000000000e-01f, 3.535533845e-01f, 2.500000000e-01f, 1.767766923e-01f, 1.250000000e-01f, 8.838834614e-02f, 6.250000000e-02f, 4.419417307e-02f, 3.125000000e-02f, 2.209708653e-02f, 1.562500000e-02f, 1.104854327e-02f, 7.812500000e-03f, 5.524271633e-03f, 3.906250000e-03f, 8.408964276e-01f, 5.946035385e-01f, 4.204482138e-01f, 2.973017693e-01f},
  };
  for (const std::vector<float>& want : expected) {
    const std::vector<float> got = alibi_slopes(static_cast<int64_t>(want.size()));
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) EXPECT_FLOAT_EQ(got[i], want[i]) << want.size() << " heads, head " << i;
  }
}

// The reference adds m_h·(kpos − qpos) to each visible score of head h (its global index
// head_offset + h), before the softmax: compared with explicit per-query softmaxes, at
// context-parallel positions (queries at the end of the keys) with documents and GQA.
TEST(Attention, AlibiBiasOfGlobalHeadAtPositions) {
  const int64_t B = 2, Sq = 5, Sk = 9, NH = 4, KV = 2, HD = 3;
  auto q = random_vector(Sq * B * NH * HD, 71, 1.5f), kv = random_vector(Sk * B * 2 * KV * HD, 72, 1.5f);
  const HeadLayout ql = contiguous_heads_layout(NH, HD);
  const HeadLayout kl{2 * KV * HD, 0, 1, 2 * HD, 0}, vl{2 * KV * HD, HD, 1, 2 * HD, 0};
  std::vector<int32_t> qpos(Sq), kpos(Sk), docs(B * Sk), qdocs(B * Sq);
  for (int64_t j = 0; j < Sk; ++j) kpos[j] = static_cast<int32_t>(2 * j + 1);
  for (int64_t i = 0; i < Sq; ++i) qpos[i] = kpos[Sk - Sq + i];
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t j = 0; j < Sk; ++j) docs[b * Sk + j] = static_cast<int32_t>(j >= 3 + b);
    for (int64_t i = 0; i < Sq; ++i) qdocs[b * Sq + i] = docs[b * Sk + Sk - Sq + i];
  }
  const std::vector<float> slopes = alibi_slopes(3 * NH);
  AttentionProblem p;
  p.B = B;
  p.Sq = Sq;
  p.Sk = Sk;
  p.NH = NH;
  p.KV = KV;
  p.HD = HD;
  p.scale = 0.6f;
  p.q_positions = qpos.data();
  p.k_positions = kpos.data();
  p.q_doc_ids = qdocs.data();
  p.k_doc_ids = docs.data();
  p.heads_total = 3 * NH;
  p.head_offset = NH;  // the second of three TP ranks
  p.alibi_slopes = slopes.data();
  std::vector<float> out(Sq * B * NH * HD), lse(B * NH * Sq);
  attention_forward_ref(p, q.data(), ql, kv.data(), kl, kv.data(), vl, out.data(), lse.data());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t i = 0; i < Sq; ++i) {
        const double m = std::pow(2.0, -8.0 * static_cast<double>(NH + h + 1) / 8.0);  // 12 heads: p = 8
        std::vector<double> w(Sk, 0.0);
        double mx = -1e300, sum = 0.0;
        for (int64_t j = 0; j < Sk; ++j) {
          if (kpos[j] > qpos[i] || docs[b * Sk + j] != qdocs[b * Sq + i]) continue;
          double dot = 0.0;
          for (int64_t c = 0; c < HD; ++c)
            dot += q[(i * B + b) * NH * HD + h * HD + c] * kv[(j * B + b) * 2 * KV * HD + (h / 2) * 2 * HD + c];
          w[j] = 0.6 * dot - m * (qpos[i] - kpos[j]);
          mx = std::max(mx, w[j]);
        }
        for (int64_t j = 0; j < Sk; ++j)
          if (kpos[j] <= qpos[i] && docs[b * Sk + j] == qdocs[b * Sq + i]) sum += std::exp(w[j] - mx);
        EXPECT_NEAR(lse[(b * NH + h) * Sq + i], mx + std::log(sum), 1e-5);
        for (int64_t c = 0; c < HD; ++c) {
          double o = 0.0;
          for (int64_t j = 0; j < Sk; ++j)
            if (kpos[j] <= qpos[i] && docs[b * Sk + j] == qdocs[b * Sq + i])
              o += std::exp(w[j] - mx) / sum * kv[(j * B + b) * 2 * KV * HD + (h / 2) * 2 * HD + HD + c];
          EXPECT_NEAR(out[(i * B + b) * NH * HD + h * HD + c], o, 1e-5) << b << " " << h << " " << i;
        }
      }
}

TEST(Attention, CausalAndDocumentMasksHide) {
  // Changing a future token or another document's token must not change a query's output.
  const int64_t B = 1, S = 6, NH = 1, KV = 1, HD = 4, row = 3 * HD;
  auto qkv = random_vector(S * row, 61);
  std::vector<int32_t> docs = {0, 0, 0, 1, 1, 1};
  AttentionProblem p;
  p.B = B;
  p.Sq = p.Sk = S;
  p.NH = NH;
  p.KV = KV;
  p.HD = HD;
  p.scale = 0.5f;
  p.q_doc_ids = p.k_doc_ids = docs.data();
  HeadLayout ql = qkv_query_layout(NH, KV, HD), kl = qkv_key_layout(NH, KV, HD), vl = qkv_value_layout(NH, KV, HD);
  std::vector<float> out1(S * HD), out2(S * HD), lse(S);
  attention_forward_ref(p, qkv.data(), ql, qkv.data(), kl, qkv.data(), vl, out1.data(), lse.data());
  for (int64_t c = 0; c < row; ++c) qkv[4 * row + c] += 1.0f;  // token 4: document 1, after query 3
  attention_forward_ref(p, qkv.data(), ql, qkv.data(), kl, qkv.data(), vl, out2.data(), lse.data());
  for (int64_t i = 0; i < 4 * HD; ++i) EXPECT_EQ(out1[i], out2[i]) << i;  // queries 0..3 unaffected
  // Query 3 is the first of its document: it sees only itself, so its output is its own value.
  for (int64_t c = 0; c < HD; ++c) EXPECT_NEAR(out1[3 * HD + c], qkv[3 * row + vl.base + c], 1e-6f);
}

TEST(Attention, SlidingWindowHidesKeysWOrMorePositionsBack) {
  // Query i sees keys i − W + 1 .. i (Hugging Face Mistral's window): with W = 3, changing token 2
  // changes queries 2, 3 and 4 and no other; with W = 1 each query's output is its own value.
  const int64_t S = 7, HD = 4, row = 3 * HD;
  auto qkv = random_vector(S * row, 62);
  AttentionProblem p;
  p.B = 1;
  p.Sq = p.Sk = S;
  p.NH = p.KV = 1;
  p.HD = HD;
  p.scale = 0.5f;
  p.window = 3;
  HeadLayout ql = qkv_query_layout(1, 1, HD), kl = qkv_key_layout(1, 1, HD), vl = qkv_value_layout(1, 1, HD);
  for (int64_t i = 0; i < S; ++i)
    for (int64_t j = 0; j < S; ++j) EXPECT_EQ(attention_visible(p, 0, i, j), j <= i && i - j < 3) << i << " " << j;
  std::vector<float> out1(S * HD), out2(S * HD), lse(S);
  attention_forward_ref(p, qkv.data(), ql, qkv.data(), kl, qkv.data(), vl, out1.data(), lse.data());
  auto changed = qkv;
  for (int64_t c = HD; c < row; ++c) changed[2 * row + c] += 1.0f;  // token 2's key and value
  attention_forward_ref(p, changed.data(), ql, changed.data(), kl, changed.data(), vl, out2.data(), lse.data());
  for (int64_t i = 0; i < S; ++i) {
    double d = 0.0;
    for (int64_t c = 0; c < HD; ++c) d = std::max(d, std::fabs(double(out1[i * HD + c]) - out2[i * HD + c]));
    if (i >= 2 && i <= 4)
      EXPECT_GT(d, 1e-4) << "query " << i;
    else
      EXPECT_EQ(d, 0.0) << "query " << i;
  }
  p.window = 1;
  attention_forward_ref(p, qkv.data(), ql, qkv.data(), kl, qkv.data(), vl, out1.data(), lse.data());
  for (int64_t i = 0; i < S; ++i)
    for (int64_t c = 0; c < HD; ++c) EXPECT_NEAR(out1[i * HD + c], qkv[i * row + vl.base + c], 1e-6f);
}

TEST(CrossEntropyGrad, MatchesFiniteDifferencesAndLogSoftmax) {
  const int64_t T = 5, V = 13;
  auto logits = random_vector(T * V, 71, 3.0f);
  std::vector<int32_t> targets = {0, 12, 5, 5, 7};
  std::vector<float> dloss = {1.0f, 0.5f, 0.0f, 2.0f, 1.0f};
  std::vector<float> mx(T), sums(T), tgt(T);
  auto loss = [&] {
    ce_row_max(logits.data(), T, V, mx.data());
    ce_sumexp_and_target(logits.data(), T, V, mx.data(), targets.data(), 0, sums.data(), tgt.data());
    double l = 0.0;
    for (int64_t t = 0; t < T; ++t) l += dloss[t] * (std::log(sums[t]) + mx[t] - tgt[t]);
    return l;
  };
  double l0 = loss();
  // Direct log-softmax in double.
  double expect = 0.0;
  for (int64_t t = 0; t < T; ++t) {
    double m = -1e30, s = 0.0;
    for (int64_t v = 0; v < V; ++v) m = std::max(m, static_cast<double>(logits[t * V + v]));
    for (int64_t v = 0; v < V; ++v) s += std::exp(logits[t * V + v] - m);
    expect += dloss[t] * (std::log(s) + m - logits[t * V + targets[t]]);
  }
  EXPECT_NEAR(l0, expect, 1e-5);
  std::vector<float> grad = logits;
  ce_backward_inplace(grad.data(), T, V, mx.data(), sums.data(), targets.data(), 0, dloss.data());
  auto dir = random_vector(T * V, 72);
  EXPECT_LT(rel_diff(dot(grad.data(), dir.data(), T * V), directional_derivative(loss, logits.data(), dir.data(), T * V, 1e-3)), kTol);
}

TEST(CrossEntropy, VocabSplitEqualsWhole) {
  const int64_t T = 3, V = 10;
  auto logits = random_vector(T * V, 81, 2.0f);
  std::vector<int32_t> targets = {1, 6, 9};
  std::vector<float> mx(T), sums(T), tgt(T);
  ce_row_max(logits.data(), T, V, mx.data());
  ce_sumexp_and_target(logits.data(), T, V, mx.data(), targets.data(), 0, sums.data(), tgt.data());
  // Two halves [0,5) and [5,10): per-half max, then combine as a TP all-reduce would.
  std::vector<float> a(T * 5), b(T * 5);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t v = 0; v < 5; ++v) {
      a[t * 5 + v] = logits[t * V + v];
      b[t * 5 + v] = logits[t * V + 5 + v];
    }
  std::vector<float> ma(T), mb(T), m(T), sa(T), sb(T), ta(T), tb(T);
  ce_row_max(a.data(), T, 5, ma.data());
  ce_row_max(b.data(), T, 5, mb.data());
  for (int64_t t = 0; t < T; ++t) m[t] = std::max(ma[t], mb[t]);
  ce_sumexp_and_target(a.data(), T, 5, m.data(), targets.data(), 0, sa.data(), ta.data());
  ce_sumexp_and_target(b.data(), T, 5, m.data(), targets.data(), 5, sb.data(), tb.data());
  for (int64_t t = 0; t < T; ++t) {
    EXPECT_NEAR(sa[t] + sb[t], sums[t], 1e-5f);
    EXPECT_EQ(ta[t] + tb[t], tgt[t]);
  }
}

TEST(EmbeddingGrad, ScatterAddWithRepeatsAndVocabSlice) {
  const int64_t T = 6, V = 5, H = 3;
  std::vector<int32_t> ids = {1, 3, 1, 4, 0, 1};
  auto W = random_vector(V * H, 91);
  std::vector<float> out(T * H);
  embedding_forward_ref(ids.data(), T, W.data(), 0, V, H, out.data());
  for (int64_t c = 0; c < H; ++c) EXPECT_EQ(out[3 * H + c], W[4 * H + c]);
  // Slice [2, 5): ids 1 and 0 give zero rows.
  std::vector<float> part(T * H);
  embedding_forward_ref(ids.data(), T, W.data() + 2 * H, 2, 3, H, part.data());
  for (int64_t c = 0; c < H; ++c) {
    EXPECT_EQ(part[0 * H + c], 0.0f);
    EXPECT_EQ(part[1 * H + c], W[3 * H + c]);
  }
  auto dout = random_vector(T * H, 92);
  std::vector<float> dW(V * H, 0.0f);
  embedding_backward_ref(ids.data(), T, dout.data(), 0, V, H, dW.data());
  for (int64_t c = 0; c < H; ++c) {
    EXPECT_NEAR(dW[1 * H + c], dout[0 * H + c] + dout[2 * H + c] + dout[5 * H + c], 1e-6f);
    EXPECT_EQ(dW[2 * H + c], 0.0f);
  }
}

TEST(Dropout, DeterministicScaledAndBackwardMatches) {
  const int64_t rows = 64, cols = 32;
  auto x = random_vector(rows * cols, 101);
  std::vector<int64_t> ids(rows);
  for (int64_t r = 0; r < rows; ++r) ids[r] = 1000 + r;
  DropoutSpec s{0.25f, 5, 9, ids.data(), cols, 0};
  std::vector<float> y(rows * cols), y2(rows * cols), dx(rows * cols);
  dropout_forward_ref(x.data(), y.data(), rows, cols, s);
  dropout_forward_ref(x.data(), y2.data(), rows, cols, s);
  EXPECT_EQ(y, y2);
  int64_t dropped = 0;
  for (int64_t i = 0; i < rows * cols; ++i) {
    if (y[i] == 0.0f) {
      ++dropped;
    } else {
      EXPECT_FLOAT_EQ(y[i], x[i] / 0.75f);
    }
  }
  EXPECT_NEAR(static_cast<double>(dropped) / (rows * cols), 0.25, 0.03);
  std::vector<float> ones(rows * cols, 1.0f);
  dropout_backward_ref(ones.data(), dx.data(), rows, cols, s);
  for (int64_t i = 0; i < rows * cols; ++i) EXPECT_EQ(dx[i] == 0.0f, y[i] == 0.0f);
  // A column slice draws the same mask as the matching columns of the whole.
  std::vector<float> xs(rows * 8), ys(rows * 8);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < 8; ++c) xs[r * 8 + c] = x[r * cols + 16 + c];
  DropoutSpec sl = s;
  sl.col_offset = 16;
  dropout_forward_ref(xs.data(), ys.data(), rows, 8, sl);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < 8; ++c) EXPECT_EQ(ys[r * 8 + c], y[r * cols + 16 + c]);
}

TEST(Optimizer, AdamWFirstStepAndWeightDecay) {
  // One step from m = v = 0: the update is lr·(sign(g)·|g|/(|g| + eps) + wd·p).
  std::vector<float> p = {1.0f, -2.0f, 0.5f}, g = {0.1f, -0.3f, 0.0f}, m(3, 0.0f), v(3, 0.0f);
  AdamWHyper h;
  h.lr = 0.01f;
  h.beta1 = 0.9f;
  h.beta2 = 0.95f;
  h.eps = 1e-8f;
  h.weight_decay = 0.1f;
  h.step = 1;
  adamw_step_ref(p.data(), g.data(), m.data(), v.data(), 3, h);
  EXPECT_NEAR(p[0], 1.0f - 0.01f * (1.0f + 0.1f * 1.0f), 1e-6f);
  EXPECT_NEAR(p[1], -2.0f - 0.01f * (-1.0f + 0.1f * -2.0f), 1e-6f);
  EXPECT_NEAR(p[2], 0.5f - 0.01f * (0.0f + 0.1f * 0.5f), 1e-6f);
  EXPECT_NEAR(m[1], -0.03f, 1e-7f);
  EXPECT_NEAR(v[1], 0.05f * 0.09f, 1e-8f);
}

TEST(Optimizer, SgdMomentumMatchesTorchRule) {
  std::vector<float> p = {1.0f}, g = {0.5f}, buf = {0.0f};
  sgd_step_ref(p.data(), g.data(), buf.data(), 1, 0.1f, 0.9f, 0.0f, true);
  EXPECT_NEAR(p[0], 0.95f, 1e-7f);
  EXPECT_NEAR(buf[0], 0.5f, 1e-7f);
  sgd_step_ref(p.data(), g.data(), buf.data(), 1, 0.1f, 0.9f, 0.0f, false);
  EXPECT_NEAR(buf[0], 0.95f, 1e-7f);
  EXPECT_NEAR(p[0], 0.95f - 0.095f, 1e-6f);
}

TEST(Optimizer, Reductions) {
  std::vector<float> x(200001);
  for (size_t i = 0; i < x.size(); ++i) x[i] = (i % 3 == 0) ? 0.0f : 0.5f;
  int64_t n = static_cast<int64_t>(x.size());
  EXPECT_EQ(count_zeros(x.data(), n), 66667);
  EXPECT_DOUBLE_EQ(sum_of_squares(x.data(), n), 0.25 * 133334);
  EXPECT_TRUE(all_finite(x.data(), n));
  x[12345] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(all_finite(x.data(), n));
}

}  // namespace
}  // namespace gale
