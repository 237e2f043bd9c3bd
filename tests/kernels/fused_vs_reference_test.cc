// Every fused kernel against its level-0 reference, for every ISA build this machine can run, on
// random shapes with odd sizes and tails. Tolerances are stated per kernel below; "exact" kernels
// keep the reference's arithmetic and must match it bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "core/threads.h"
#include "fused_test_util.h"
#include "kernels/cpu/fused_ops.h"
#include "kernels/op_table.h"
#include "testing.h"

namespace gale {
namespace {

using testing::bit_differences;
using testing::peak_rel_error;
using testing::random_vector;
using testing::runnable_isas;

// Tolerances: max |fused − reference| / max |reference| over each output array (forward outputs and
// every gradient). Measured maxima over all cases and ISAs on the development machine in brackets.
constexpr double kNormTol = 1e-6;        // float blocks vs double row sums, FMA [3.3e-7]
constexpr double kActivationTol = 1e-6;  // vector erf/exp (≤ 2.5 ulp) inside GeLU/SiLU [3.3e-7]
constexpr double kAttentionTol = 2e-6;   // tiled online softmax vs full rows: out, lse, dq, dk, dv [6.3e-7]
constexpr double kLmHeadTol = 3e-6;      // chunked logits, stats and gradients [8.2e-7]
// Exact (bit-identical): bias_dropout_add (+ its backward and dbias), plain dropout, the residual output of
// bias_dropout_add_norm, RoPE, embedding, AdamW, and the in-place bias add of the activations.

class FusedVsReference : public ::testing::TestWithParam<Isa> {
 protected:
  const FusedKernelSet& fused() const { return *fused_kernel_set(GetParam()); }
  OpTable ref_ = reference_ops();
};

std::string isa_test_name(const ::testing::TestParamInfo<Isa>& info) { return isa_name(info.param); }

// ---------------------------------------------------------------- norms

struct NormShape {
  int64_t rows, H;
};
const NormShape kNormShapes[] = {{1, 1}, {7, 33}, {64, 768}, {5, 100}, {33, 17}, {3, 1000}, {40, 16}, {2, 4097}};

TEST_P(FusedVsReference, NormForwardAndBackward) {
  for (bool rms : {false, true})
    for (bool bias : {false, true}) {
      if (rms && bias) continue;
      for (const NormShape& sh : kNormShapes) {
        SCOPED_TRACE(::testing::Message() << "rms " << rms << " bias " << bias << " rows " << sh.rows << " H " << sh.H);
        const int64_t n = sh.rows * sh.H, stat_rows = rms ? 1 : 2;
        const NormSpec spec{rms, 1e-5f};
        auto x = random_vector(n, 1, 3.0f), w = random_vector(sh.H, 2), b = random_vector(sh.H, 3);
        auto dy = random_vector(n, 4);
        for (int64_t i = 0; i < n; ++i) x[i] += 0.5f;  // a nonzero mean
        std::vector<float> y_ref(n), y(n), st_ref(stat_rows * sh.rows), st(stat_rows * sh.rows);
        ref_.norm_forward(spec, x.data(), w.data(), bias ? b.data() : nullptr, y_ref.data(), st_ref.data(), sh.rows,
                          sh.H);
        fused().norm_forward(spec, x.data(), w.data(), bias ? b.data() : nullptr, y.data(), st.data(), sh.rows, sh.H);
        EXPECT_LE(peak_rel_error(y, y_ref), kNormTol);
        EXPECT_LE(peak_rel_error(st, st_ref), kNormTol);
        // Backward: dw/db accumulate onto existing values.
        auto dw0 = random_vector(sh.H, 5), db0 = random_vector(sh.H, 6);
        std::vector<float> dx_ref(n), dx(n, 7.0f), dw_ref = dw0, dw = dw0, db_ref = db0, db = db0;
        float* db_ref_ptr = rms ? nullptr : db_ref.data();
        float* db_ptr = rms ? nullptr : db.data();
        ref_.norm_backward(spec, dy.data(), x.data(), w.data(), st_ref.data(), dx_ref.data(), dw_ref.data(), db_ref_ptr,
                           sh.rows, sh.H);
        fused().norm_backward(spec, dy.data(), x.data(), w.data(), st_ref.data(), dx.data(), dw.data(), db_ptr, sh.rows,
                              sh.H);
        // dx: natural scale rstd·|dy·w| with dy, w = O(1) (for H = 1 it is 0 up to rounding).
        double dx_scale = 0.0;
        for (int64_t r = 0; r < sh.rows; ++r)
          dx_scale = std::max(dx_scale, static_cast<double>(st_ref[(stat_rows - 1) * sh.rows + r]));
        EXPECT_LE(peak_rel_error(dx, dx_ref, dx_scale), kNormTol);
        EXPECT_LE(peak_rel_error(dw, dw_ref), kNormTol);
        EXPECT_LE(peak_rel_error(db, db_ref), kNormTol);
        // Without weight gradients only dx is produced.
        std::vector<float> dx2(n);
        fused().norm_backward(spec, dy.data(), x.data(), w.data(), st_ref.data(), dx2.data(), nullptr, nullptr, sh.rows,
                              sh.H);
        EXPECT_EQ(bit_differences(dx2, dx), 0);
      }
    }
}

TEST_P(FusedVsReference, NormWeightGradientsDoNotDependOnThreadCount) {
  const int64_t rows = 77, H = 129;
  auto x = random_vector(rows * H, 11), w = random_vector(H, 12), dy = random_vector(rows * H, 13);
  std::vector<float> st(2 * rows), y(rows * H), dx(rows * H);
  fused().norm_forward(NormSpec{}, x.data(), w.data(), nullptr, y.data(), st.data(), rows, H);
  std::vector<std::vector<float>> dws;
  const int saved = num_threads();
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    std::vector<float> dw(H, 0.0f), db(H, 0.0f);
    fused().norm_backward(NormSpec{}, dy.data(), x.data(), w.data(), st.data(), dx.data(), dw.data(), db.data(), rows,
                          H);
    dw.insert(dw.end(), db.begin(), db.end());
    dws.push_back(dw);
  }
  set_num_threads(saved);
  EXPECT_EQ(bit_differences(dws[0], dws[1]), 0);
  EXPECT_EQ(bit_differences(dws[0], dws[2]), 0);
}

// ---------------------------------------------------------------- residual + bias + dropout (+ norm)

DropoutSpec make_dropout(float p, const std::vector<int64_t>& row_ids, int64_t cols_total, int64_t col_offset) {
  DropoutSpec d;
  d.p = p;
  d.seed = 1234;
  d.stream = 77;
  d.row_ids = row_ids.data();
  d.cols_total = cols_total;
  d.col_offset = col_offset;
  return d;
}

TEST_P(FusedVsReference, BiasDropoutAddIsExact) {
  for (const NormShape& sh : kNormShapes)
    for (float p : {0.0f, 0.1f, 0.5f})
      for (bool bias : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "rows " << sh.rows << " cols " << sh.H << " p " << p << " bias " << bias);
        const int64_t n = sh.rows * sh.H;
        std::vector<int64_t> row_ids(sh.rows);
        for (int64_t r = 0; r < sh.rows; ++r) row_ids[r] = 1000 + 3 * r;
        const DropoutSpec d = make_dropout(p, row_ids, sh.H + 5, 3);  // a column slice of a wider matrix
        auto x = random_vector(n, 21), bvec = random_vector(sh.H, 22), res = random_vector(n, 23);
        std::vector<float> x_ref = x, out_ref(n), out(n);
        ref_.bias_dropout_add(x_ref.data(), bias ? bvec.data() : nullptr, res.data(), out_ref.data(), sh.rows, sh.H, d);
        fused().bias_dropout_add(x.data(), bias ? bvec.data() : nullptr, res.data(), out.data(), sh.rows, sh.H, d);
        EXPECT_EQ(bit_differences(out, out_ref), 0);
        // In place on the residual (out aliases residual).
        std::vector<float> inplace = res;
        fused().bias_dropout_add(x.data(), bias ? bvec.data() : nullptr, inplace.data(), inplace.data(), sh.rows, sh.H,
                                 d);
        EXPECT_EQ(bit_differences(inplace, out_ref), 0);
        // Backward: dx written, dbias accumulated.
        auto dout = random_vector(n, 24), db0 = random_vector(sh.H, 25);
        std::vector<float> dx_ref(n), dx(n, 9.0f), db_ref = db0, db = db0;
        ref_.bias_dropout_add_backward(dout.data(), dx_ref.data(), bias ? db_ref.data() : nullptr, sh.rows, sh.H, d);
        fused().bias_dropout_add_backward(dout.data(), dx.data(), bias ? db.data() : nullptr, sh.rows, sh.H, d);
        EXPECT_EQ(bit_differences(dx, dx_ref), 0);
        EXPECT_EQ(bit_differences(db, db_ref), 0);
      }
}

TEST_P(FusedVsReference, PlainDropoutIsExact) {
  for (const NormShape& sh : kNormShapes)
    for (float p : {0.1f, 0.5f}) {
      SCOPED_TRACE(::testing::Message() << "rows " << sh.rows << " cols " << sh.H << " p " << p);
      const int64_t n = sh.rows * sh.H;
      std::vector<int64_t> row_ids(sh.rows);
      for (int64_t r = 0; r < sh.rows; ++r) row_ids[r] = 7 + 5 * r;
      const DropoutSpec d = make_dropout(p, row_ids, sh.H + 3, 2);
      auto x = random_vector(n, 26);
      std::vector<float> y_ref(n), y(n, 4.0f);
      ref_.dropout(x.data(), y_ref.data(), sh.rows, sh.H, d);
      fused().dropout(x.data(), y.data(), sh.rows, sh.H, d);
      EXPECT_EQ(bit_differences(y, y_ref), 0);
      std::vector<float> inplace = x;  // y aliases x, as the embeddings use it
      fused().dropout(inplace.data(), inplace.data(), sh.rows, sh.H, d);
      EXPECT_EQ(bit_differences(inplace, y_ref), 0);
      // The reference's backward draws the same mask and scale as its forward.
      std::vector<float> dx_ref(n);
      dropout_backward_ref(x.data(), dx_ref.data(), sh.rows, sh.H, d);
      EXPECT_EQ(bit_differences(dx_ref, y_ref), 0);
      int64_t dropped = 0;
      for (float v : y_ref) dropped += v == 0.0f;
      if (n >= 1000) {
        EXPECT_NEAR(static_cast<double>(dropped) / n, p, 0.05);
      }
    }
}

TEST_P(FusedVsReference, BiasDropoutAddNorm) {
  for (bool rms : {false, true})
    for (const NormShape& sh : kNormShapes)
      for (float p : {0.0f, 0.2f}) {
        SCOPED_TRACE(::testing::Message() << "rms " << rms << " rows " << sh.rows << " H " << sh.H << " p " << p);
        const int64_t n = sh.rows * sh.H, stat_rows = rms ? 1 : 2;
        std::vector<int64_t> row_ids(sh.rows);
        std::iota(row_ids.begin(), row_ids.end(), 5);
        const DropoutSpec d = make_dropout(p, row_ids, sh.H, 0);
        const NormSpec spec{rms, 1e-6f};
        auto x = random_vector(n, 31), bvec = random_vector(sh.H, 32), res = random_vector(n, 33, 2.0f);
        auto w = random_vector(sh.H, 34), nb = random_vector(sh.H, 35);
        const float* nbias = rms ? nullptr : nb.data();
        std::vector<float> x_ref = x, out_ref(n), out(n), y_ref(n), y(n), st_ref(stat_rows * sh.rows),
                           st(stat_rows * sh.rows);
        ref_.bias_dropout_add_norm(x_ref.data(), bvec.data(), res.data(), out_ref.data(), spec, w.data(), nbias,
                                   y_ref.data(), st_ref.data(), sh.rows, sh.H, d);
        fused().bias_dropout_add_norm(x.data(), bvec.data(), res.data(), out.data(), spec, w.data(), nbias, y.data(),
                                      st.data(), sh.rows, sh.H, d);
        EXPECT_EQ(bit_differences(out, out_ref), 0);
        EXPECT_LE(peak_rel_error(y, y_ref), kNormTol);
        EXPECT_LE(peak_rel_error(st, st_ref), kNormTol);
      }
}

// ---------------------------------------------------------------- activations

struct ActShape {
  int64_t rows, F;
};
const ActShape kActShapes[] = {{1, 1}, {3, 7}, {16, 3072}, {5, 33}, {9, 100}};

TEST_P(FusedVsReference, GeluWithBias) {
  for (const ActShape& sh : kActShapes)
    for (bool bias : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "rows " << sh.rows << " F " << sh.F << " bias " << bias);
      const int64_t n = sh.rows * sh.F;
      auto u0 = random_vector(n, 41, 5.0f), bvec = random_vector(sh.F, 42), dact = random_vector(n, 43);
      std::vector<float> u_ref = u0, u = u0, a_ref(n), a(n);
      ref_.gelu_forward(u_ref.data(), bias ? bvec.data() : nullptr, a_ref.data(), sh.rows, sh.F);
      fused().gelu_forward(u.data(), bias ? bvec.data() : nullptr, a.data(), sh.rows, sh.F);
      EXPECT_EQ(bit_differences(u, u_ref), 0);  // bias added in place, exactly
      EXPECT_LE(peak_rel_error(a, a_ref), kActivationTol);
      auto db0 = random_vector(sh.F, 44);
      std::vector<float> du_ref(n), du(n), db_ref = db0, db = db0;
      ref_.gelu_backward(dact.data(), u_ref.data(), du_ref.data(), bias ? db_ref.data() : nullptr, sh.rows, sh.F);
      fused().gelu_backward(dact.data(), u_ref.data(), du.data(), bias ? db.data() : nullptr, sh.rows, sh.F);
      EXPECT_LE(peak_rel_error(du, du_ref), kActivationTol);
      EXPECT_LE(peak_rel_error(db, db_ref), kActivationTol);
    }
}

TEST_P(FusedVsReference, SwigluWithBias) {
  for (const ActShape& sh : kActShapes)
    for (bool bias : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "rows " << sh.rows << " F " << sh.F << " bias " << bias);
      const int64_t n = sh.rows * sh.F;
      auto u0 = random_vector(2 * n, 51, 6.0f), bvec = random_vector(2 * sh.F, 52), dact = random_vector(n, 53);
      std::vector<float> u_ref = u0, u = u0, a_ref(n), a(n);
      ref_.swiglu_forward(u_ref.data(), bias ? bvec.data() : nullptr, a_ref.data(), sh.rows, sh.F);
      fused().swiglu_forward(u.data(), bias ? bvec.data() : nullptr, a.data(), sh.rows, sh.F);
      EXPECT_EQ(bit_differences(u, u_ref), 0);
      EXPECT_LE(peak_rel_error(a, a_ref), kActivationTol);
      auto db0 = random_vector(2 * sh.F, 54);
      std::vector<float> du_ref(2 * n), du(2 * n), db_ref = db0, db = db0;
      ref_.swiglu_backward(dact.data(), u_ref.data(), du_ref.data(), bias ? db_ref.data() : nullptr, sh.rows, sh.F);
      fused().swiglu_backward(dact.data(), u_ref.data(), du.data(), bias ? db.data() : nullptr, sh.rows, sh.F);
      EXPECT_LE(peak_rel_error(du, du_ref), kActivationTol);
      EXPECT_LE(peak_rel_error(db, db_ref), kActivationTol);
    }
}

TEST_P(FusedVsReference, GluWithBiasOffsetAndClamp) {
  // gpt-oss's clamped quick GeGLU with offset, plain quick GeGLU, and clamped SwiGLU; inputs of scale 6
  // put many entries past the clamp 3.
  const GluSpec specs[] = {{kQuickGeluAlpha, 1.0f, 3.0f}, {kQuickGeluAlpha, 0.0f, HUGE_VALF}, {1.0f, 0.0f, 3.0f}};
  for (const GluSpec& spec : specs)
    for (const ActShape& sh : kActShapes)
      for (bool bias : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "alpha " << spec.alpha << " offset " << spec.linear_offset << " clamp "
                                          << spec.clamp << " rows " << sh.rows << " F " << sh.F << " bias " << bias);
        const int64_t n = sh.rows * sh.F;
        auto u0 = random_vector(2 * n, 55, 6.0f), bvec = random_vector(2 * sh.F, 56), dact = random_vector(n, 57);
        std::vector<float> u_ref = u0, u = u0, a_ref(n), a(n);
        ref_.glu_forward(spec, u_ref.data(), bias ? bvec.data() : nullptr, a_ref.data(), sh.rows, sh.F);
        fused().glu_forward(spec, u.data(), bias ? bvec.data() : nullptr, a.data(), sh.rows, sh.F);
        EXPECT_EQ(bit_differences(u, u_ref), 0);
        EXPECT_LE(peak_rel_error(a, a_ref), kActivationTol);
        auto db0 = random_vector(2 * sh.F, 58);
        std::vector<float> du_ref(2 * n), du(2 * n), db_ref = db0, db = db0;
        ref_.glu_backward(spec, dact.data(), u_ref.data(), du_ref.data(), bias ? db_ref.data() : nullptr, sh.rows,
                          sh.F);
        fused().glu_backward(spec, dact.data(), u_ref.data(), du.data(), bias ? db.data() : nullptr, sh.rows, sh.F);
        EXPECT_LE(peak_rel_error(du, du_ref), kActivationTol);
        EXPECT_LE(peak_rel_error(db, db_ref), kActivationTol);
        // The clamped entries' gradients are exactly zero in both.
        for (int64_t i = 0; i < 2 * n; ++i)
          if (du_ref[i] == 0.0f) EXPECT_EQ(du[i], 0.0f) << i;
      }
}

TEST_P(FusedVsReference, ActivationsKeepInfAndNanBehaviour) {
  // Saturated inputs: GeLU(−40) = −0, GeLU(40) = 40, SiLU(±100) finite; NaN propagates.
  std::vector<float> u = {-40.0f, 40.0f, -100.0f, 100.0f, NAN, 0.0f, -0.0f, 3.0f};
  const int64_t n = static_cast<int64_t>(u.size());
  std::vector<float> u_ref = u, a_ref(n), a(n);
  ref_.gelu_forward(u_ref.data(), nullptr, a_ref.data(), 1, n);
  fused().gelu_forward(u.data(), nullptr, a.data(), 1, n);
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(a_ref[i]))
      EXPECT_TRUE(std::isnan(a[i]));
    else
      EXPECT_NEAR(a[i], a_ref[i], 1e-6f * std::max(1.0f, std::fabs(a_ref[i]))) << u[i];
  }
  std::vector<float> g = {-100.0f, 100.0f, NAN, 1.0f, 1.0f, 1.0f, 2.0f, 2.0f};  // gate | up
  std::vector<float> g_ref = g, s_ref(4), s(4);
  ref_.swiglu_forward(g_ref.data(), nullptr, s_ref.data(), 1, 4);
  fused().swiglu_forward(g.data(), nullptr, s.data(), 1, 4);
  EXPECT_NEAR(s[0], s_ref[0], 1e-30f);
  EXPECT_NEAR(s[1], s_ref[1], 1e-4f);
  EXPECT_TRUE(std::isnan(s[2]));
}

// ---------------------------------------------------------------- RoPE

TEST_P(FusedVsReference, RopeIsExact) {
  struct Case {
    int64_t S, B, NH, KV, HD;
    double percent;
  };
  for (const Case& c : {Case{5, 2, 4, 2, 64, 1.0}, Case{7, 3, 3, 1, 80, 0.5}, Case{1, 1, 1, 1, 2, 1.0},
                        Case{9, 2, 8, 1, 34, 1.0}, Case{4, 1, 2, 2, 128, 0.25}}) {
    SCOPED_TRACE(::testing::Message() << "S " << c.S << " B " << c.B << " NH " << c.NH << " HD " << c.HD);
    const int64_t rot = static_cast<int64_t>(c.HD * c.percent), row = (c.NH + 2 * c.KV) * c.HD;
    RopeTables tables = make_rope_tables(64, rot, 10000.0);
    std::vector<int32_t> pos(c.B * c.S);
    for (int64_t i = 0; i < c.B * c.S; ++i) pos[i] = static_cast<int32_t>((i * 7) % 64);
    auto x = random_vector(c.S * c.B * row, 61);
    // Interleaved tables (--rotary-interleaved) are handed to the reference: still exact.
    for (int mode = 0; mode < 4; ++mode) {
      const bool backward = mode % 2 == 1;
      tables.interleaved = mode >= 2;
      std::vector<float> a = x, b = x;
      const HeadLayout ql = qkv_query_layout(c.NH, c.KV, c.HD), kl = qkv_key_layout(c.NH, c.KV, c.HD);
      RopeFn rf = backward ? ref_.rope_backward : ref_.rope_forward;
      RopeFn ff = backward ? fused().rope_backward : fused().rope_forward;
      rf(a.data(), ql, c.NH, c.S, c.B, c.HD, pos.data(), tables);
      rf(a.data(), kl, c.KV, c.S, c.B, c.HD, pos.data(), tables);
      ff(b.data(), ql, c.NH, c.S, c.B, c.HD, pos.data(), tables);
      ff(b.data(), kl, c.KV, c.S, c.B, c.HD, pos.data(), tables);
      EXPECT_EQ(bit_differences(a, b), 0);
    }
  }
}

// ---------------------------------------------------------------- embedding, AdamW

TEST_P(FusedVsReference, EmbeddingIsExact) {
  struct Case {
    int64_t T, V, H, vocab_start, Vl;
  };
  for (const Case& c :
       {Case{1, 10, 1, 0, 10}, Case{37, 50, 33, 0, 50}, Case{64, 40, 768, 20, 20}, Case{9, 3, 100, 1, 2}}) {
    SCOPED_TRACE(::testing::Message() << "T " << c.T << " H " << c.H << " slice " << c.vocab_start);
    std::vector<int32_t> ids(c.T);
    for (int64_t t = 0; t < c.T; ++t) ids[t] = static_cast<int32_t>((t * 13 + t / 3) % c.V);  // repeats
    auto W = random_vector(c.Vl * c.H, 71), dout = random_vector(c.T * c.H, 72), dW0 = random_vector(c.Vl * c.H, 73);
    std::vector<float> o_ref(c.T * c.H), o(c.T * c.H, 5.0f), dW_ref = dW0, dW = dW0;
    ref_.embedding_forward(ids.data(), c.T, W.data(), c.vocab_start, c.Vl, c.H, o_ref.data());
    fused().embedding_forward(ids.data(), c.T, W.data(), c.vocab_start, c.Vl, c.H, o.data());
    EXPECT_EQ(bit_differences(o, o_ref), 0);
    ref_.embedding_backward(ids.data(), c.T, dout.data(), c.vocab_start, c.Vl, c.H, dW_ref.data());
    fused().embedding_backward(ids.data(), c.T, dout.data(), c.vocab_start, c.Vl, c.H, dW.data());
    EXPECT_EQ(bit_differences(dW, dW_ref), 0);
  }
}

TEST_P(FusedVsReference, AdamWIsExact) {
  for (int64_t n : {1, 15, 17, 1000, 100003})
    for (int64_t step : {1, 2, 1000}) {
      SCOPED_TRACE(::testing::Message() << "n " << n << " step " << step);
      AdamWHyper h;
      h.lr = 3e-4f;
      h.weight_decay = 0.1f;
      h.step = step;
      auto p0 = random_vector(n, 81), g = random_vector(n, 82, 0.01f), m0 = random_vector(n, 83, 0.001f);
      auto v0 = random_vector(n, 84, 1e-6f);
      for (auto& x : v0) x = std::fabs(x);
      std::vector<float> p_ref = p0, m_ref = m0, v_ref = v0, p = p0, m = m0, v = v0;
      ref_.adamw_step(p_ref.data(), g.data(), m_ref.data(), v_ref.data(), n, h);
      fused().adamw_step(p.data(), g.data(), m.data(), v.data(), n, h);
      EXPECT_EQ(bit_differences(p, p_ref), 0);
      EXPECT_EQ(bit_differences(m, m_ref), 0);
      EXPECT_EQ(bit_differences(v, v_ref), 0);
    }
}

// --optimizer-selection fused_ema_adamw: the one-pass kernel equals the reference (AdamW, then the
// EMA pass) bit for bit, and its parameters and moments are plain AdamW's.
TEST_P(FusedVsReference, EmaAdamWIsExact) {
  for (int64_t n : {1, 15, 17, 1000, 100003})
    for (float decay : {0.0f, 2.0f / 11.0f, 0.9999f, 1.0f}) {
      SCOPED_TRACE(::testing::Message() << "n " << n << " decay " << decay);
      AdamWHyper h;
      h.lr = 3e-4f;
      h.weight_decay = 0.1f;
      h.step = 7;
      h.grad_scale = 0.5f;
      auto p0 = random_vector(n, 91), g = random_vector(n, 92, 0.01f), m0 = random_vector(n, 93, 0.001f);
      auto v0 = random_vector(n, 94, 1e-6f), s0 = random_vector(n, 95);
      for (auto& x : v0) x = std::fabs(x);
      std::vector<float> p_ref = p0, m_ref = m0, v_ref = v0, s_ref = s0, p = p0, m = m0, v = v0, s = s0;
      ref_.ema_adamw_step(p_ref.data(), g.data(), m_ref.data(), v_ref.data(), s_ref.data(), n, h, decay);
      fused().ema_adamw_step(p.data(), g.data(), m.data(), v.data(), s.data(), n, h, decay);
      EXPECT_EQ(bit_differences(p, p_ref), 0);
      EXPECT_EQ(bit_differences(m, m_ref), 0);
      EXPECT_EQ(bit_differences(v, v_ref), 0);
      EXPECT_EQ(bit_differences(s, s_ref), 0);
      std::vector<float> p_adam = p0, m_adam = m0, v_adam = v0;
      fused().adamw_step(p_adam.data(), g.data(), m_adam.data(), v_adam.data(), n, h);
      EXPECT_EQ(bit_differences(p, p_adam), 0) << "the EMA must not change the AdamW step";
      EXPECT_EQ(bit_differences(m, m_adam), 0);
      EXPECT_EQ(bit_differences(v, v_adam), 0);
      // The EMA: d·s + (1 − d)·p_new element by element (decay 1 keeps s, 0 takes p_new).
      for (int64_t i = 0; i < n; i += std::max<int64_t>(1, n / 7))
        EXPECT_EQ(s_ref[i], decay * s0[i] + (1.0f - decay) * p_ref[i]) << i;
      if (decay == 1.0f) EXPECT_EQ(bit_differences(s, s0), 0);
      if (decay == 0.0f) EXPECT_EQ(bit_differences(s, p), 0);
    }
}

TEST_P(FusedVsReference, AdamWGradScaleEqualsClippingFirst) {
  const int64_t n = 5001;
  AdamWHyper h;
  h.lr = 1e-3f;
  h.weight_decay = 0.01f;
  h.step = 3;
  auto p0 = random_vector(n, 85), g = random_vector(n, 86, 0.1f), m0 = random_vector(n, 87, 0.01f);
  auto v0 = random_vector(n, 88, 1e-4f);
  for (auto& x : v0) x = std::fabs(x);
  const float coeff = 0.37f;
  // Two passes (clip, then step) with the reference ...
  std::vector<float> g_clipped = g, p_ref = p0, m_ref = m0, v_ref = v0;
  scale_inplace(g_clipped.data(), n, coeff);
  ref_.adamw_step(p_ref.data(), g_clipped.data(), m_ref.data(), v_ref.data(), n, h);
  // ... equal one pass with grad_scale, for the reference and the fused step.
  h.grad_scale = coeff;
  for (AdamWFn fn : {ref_.adamw_step, fused().adamw_step}) {
    std::vector<float> p = p0, m = m0, v = v0;
    fn(p.data(), g.data(), m.data(), v.data(), n, h);
    EXPECT_EQ(bit_differences(p, p_ref), 0);
    EXPECT_EQ(bit_differences(m, m_ref), 0);
    EXPECT_EQ(bit_differences(v, v_ref), 0);
  }
}

TEST_P(FusedVsReference, SumOfSquares) {
  for (int64_t n : {0, 1, 17, 65536, 65537, 300001}) {
    auto x = random_vector(n, 89, 3.0f);
    const double ref = sum_of_squares(x.data(), n), got = fused().sum_of_squares(x.data(), n);
    EXPECT_LE(std::fabs(got - ref), 1e-6 * std::max(ref, 1e-30)) << n;
  }
}

// ---------------------------------------------------------------- attention

struct AttnCase {
  const char* name;
  int64_t B, Sq, Sk, NH, KV, HD;
  bool causal, docs;
  int positions;  // explicit q/k positions: 1 a context-parallel chunk, 2 the same with gaps between key positions
  float dropout;
  int64_t window = 0;  // sliding window (0: none)
  bool alibi = false;  // ALiBi bias (the slopes of 2·NH heads; these are the second TP rank's)
  int sink = 0;        // --softmax-type: 0 vanilla, 1 off-by-one (zero logits), 2 learnable logits
};

const AttnCase kAttnCases[] = {
    {"tiny_T1", 1, 1, 1, 1, 1, 4, true, false, false, 0.0f},
    {"gpt_like_causal", 2, 100, 100, 4, 4, 64, true, false, false, 0.0f},
    {"hd80_not_causal", 1, 70, 70, 2, 2, 80, false, false, false, 0.0f},
    {"gqa8_kv1", 2, 65, 65, 8, 1, 16, true, false, false, 0.0f},
    {"gqa_docs_dropout", 2, 130, 130, 4, 2, 8, true, true, false, 0.1f},
    {"docs_not_causal", 1, 77, 77, 2, 1, 12, false, true, false, 0.0f},
    {"dropout_heavy", 1, 64, 64, 2, 2, 32, true, false, false, 0.5f},
    {"cp_chunk_positions", 2, 40, 150, 3, 3, 24, true, false, true, 0.2f},
    {"cp_positions_docs", 1, 33, 90, 2, 1, 20, true, true, true, 0.0f},
    {"cp_positions_gaps_dropout", 2, 37, 140, 2, 2, 16, true, false, 2, 0.3f},
    {"odd_hd", 3, 19, 19, 3, 1, 7, true, false, false, 0.1f},
    {"long_tiles", 1, 200, 200, 1, 1, 64, true, false, false, 0.0f},
    // Sliding windows: W = 1 (only itself), small W on odd shapes with GQA, documents and dropout,
    // W across tile boundaries (most key tiles skipped), W >= S (no effect), context-parallel
    // positions with and without gaps, and a window without the causal mask.
    {"window1", 2, 70, 70, 2, 1, 8, true, false, false, 0.0f, 1},
    {"window5_gqa_docs_dropout", 2, 130, 130, 4, 2, 12, true, true, false, 0.1f, 5},
    {"window64_long", 1, 300, 300, 2, 2, 16, true, false, false, 0.0f, 64},
    {"window67_long_gqa", 2, 257, 257, 4, 1, 20, true, false, false, 0.2f, 67},
    {"window_covers_all", 1, 100, 100, 2, 2, 24, true, false, false, 0.0f, 100},
    {"window_odd_hd", 3, 19, 19, 3, 1, 7, true, false, false, 0.1f, 6},
    {"window_cp_chunk", 2, 40, 150, 3, 3, 24, true, true, true, 0.0f, 37},
    {"window_cp_gaps_dropout", 2, 37, 140, 2, 2, 16, true, false, 2, 0.3f, 20},
    {"window_not_causal", 1, 77, 77, 2, 1, 12, false, false, false, 0.0f, 9},
    // ALiBi: odd shapes across tiles, GQA, documents, dropout, context-parallel positions (with
    // gaps), sliding windows, keys ahead of the query (not causal).
    {"alibi_causal", 2, 100, 100, 4, 4, 16, true, false, false, 0.0f, 0, true},
    {"alibi_gqa_docs_dropout", 2, 130, 130, 6, 2, 12, true, true, false, 0.1f, 0, true},
    {"alibi_odd_hd", 3, 19, 19, 3, 1, 7, true, false, false, 0.0f, 0, true},
    {"alibi_cp_chunk_docs", 2, 40, 150, 5, 5, 24, true, true, true, 0.0f, 0, true},
    {"alibi_cp_gaps_dropout", 2, 37, 140, 2, 2, 16, true, false, 2, 0.3f, 0, true},
    {"alibi_window_gqa", 2, 257, 257, 4, 1, 20, true, false, false, 0.0f, 67, true},
    {"alibi_window_cp", 2, 40, 150, 3, 3, 24, true, true, true, 0.0f, 37, true},
    {"alibi_not_causal", 1, 77, 77, 2, 1, 12, false, false, false, 0.0f, 0, true},
    // --softmax-type sinks (the logit starts each row's online softmax): odd shapes, GQA, causal
    // and document masks, context-parallel positions (rows that see no key: out 0, lse σ), windows,
    // ALiBi, dropout, one token.
    {"sink_zero_causal", 2, 100, 100, 4, 4, 16, true, false, false, 0.0f, 0, false, 1},
    {"sink_tiny_T1", 1, 1, 1, 1, 1, 4, true, false, false, 0.0f, 0, false, 2},
    {"sink_gqa_docs_dropout", 2, 130, 130, 6, 2, 12, true, true, false, 0.1f, 0, false, 2},
    {"sink_odd_hd", 3, 19, 19, 3, 1, 7, true, false, false, 0.0f, 0, false, 2},
    {"sink_docs_not_causal", 1, 77, 77, 2, 1, 12, false, true, false, 0.0f, 0, false, 2},
    {"sink_cp_positions_docs", 1, 33, 90, 2, 1, 20, true, true, true, 0.0f, 0, false, 2},
    {"sink_cp_gaps_dropout", 2, 37, 140, 2, 2, 16, true, false, 2, 0.3f, 0, false, 1},
    {"sink_window_gqa_alibi", 2, 257, 257, 4, 1, 20, true, false, false, 0.0f, 67, true, 2},
    {"sink_long_tiles", 1, 200, 200, 2, 2, 64, true, false, false, 0.0f, 0, false, 2},
};

class FlashVsReference : public ::testing::TestWithParam<std::tuple<Isa, AttnCase>> {};

TEST_P(FlashVsReference, ForwardAndBackward) {
  const Isa isa = std::get<0>(GetParam());
  const AttnCase c = std::get<1>(GetParam());
  const FusedKernelSet& f = *fused_kernel_set(isa);
  // Queries in one buffer, keys and values in a packed [Sk·B, KV, 2, HD] buffer (so Sq ≠ Sk works).
  const int64_t q_row = c.NH * c.HD, kv_row = 2 * c.KV * c.HD;
  auto q = random_vector(c.Sq * c.B * q_row, 91, 1.5f), kv = random_vector(c.Sk * c.B * kv_row, 92, 1.5f);
  const HeadLayout ql = contiguous_heads_layout(c.NH, c.HD);
  const HeadLayout kl{kv_row, 0, 1, 2 * c.HD, 0}, vl{kv_row, c.HD, 1, 2 * c.HD, 0};
  std::vector<int32_t> qpos(c.Sq), kpos(c.Sk), qdoc(c.B * c.Sq), kdoc(c.B * c.Sk);
  // Gaps: every 5th key position skipped, so key tiles are not runs of consecutive positions.
  for (int64_t j = 0; j < c.Sk; ++j) kpos[j] = static_cast<int32_t>(c.positions == 2 ? j + j / 4 : j);
  // A context-parallel chunk: the queries are at the last Sq key positions.
  for (int64_t i = 0; i < c.Sq; ++i) qpos[i] = c.positions ? kpos[c.Sk - c.Sq + i] : static_cast<int32_t>(i);
  for (int64_t b = 0; b < c.B; ++b) {
    // Documents of 1..40 tokens: boundaries differ per batch row.
    auto doc_of = [&](int64_t pos) { return static_cast<int32_t>((pos * (b + 2) / 37) % 5); };
    for (int64_t i = 0; i < c.Sq; ++i) qdoc[b * c.Sq + i] = doc_of(qpos[i]);
    for (int64_t j = 0; j < c.Sk; ++j) kdoc[b * c.Sk + j] = doc_of(kpos[j]);
  }
  std::vector<int64_t> samples(c.B);
  for (int64_t b = 0; b < c.B; ++b) samples[b] = 100 + 7 * b;
  AttentionProblem p;
  p.B = c.B;
  p.Sq = c.Sq;
  p.Sk = c.Sk;
  p.NH = c.NH;
  p.KV = c.KV;
  p.HD = c.HD;
  p.scale = 1.0f / std::sqrt(static_cast<float>(c.HD));
  p.causal = c.causal;
  p.window = c.window;
  if (c.positions) {
    p.q_positions = qpos.data();
    p.k_positions = kpos.data();
  }
  if (c.docs) {
    p.q_doc_ids = qdoc.data();
    p.k_doc_ids = kdoc.data();
  }
  p.dropout_p = c.dropout;
  p.dropout_seed = 99;
  p.dropout_stream = 5;
  p.sample_ids = samples.data();
  p.heads_total = 2 * c.NH;
  p.head_offset = c.NH;  // the second of two TP ranks
  p.max_positions = kpos[c.Sk - 1] + 1;
  const std::vector<float> slopes = alibi_slopes(p.heads_total);
  if (c.alibi) p.alibi_slopes = slopes.data();
  std::vector<float> sinks(static_cast<size_t>(c.NH), 0.0f);  // this rank's heads' logits, one large
  if (c.sink == 2)
    for (int64_t h = 0; h < c.NH; ++h) sinks[h] = h == 0 ? 6.0f : -2.0f + 1.5f * static_cast<float>(h);
  if (c.sink) p.softmax_offset = sinks.data();

  const int64_t out_n = c.Sq * c.B * q_row, lse_n = c.B * c.NH * c.Sq;
  std::vector<float> out_ref(out_n), lse_ref(lse_n), out(out_n, 3.0f), lse(lse_n, 3.0f);
  attention_forward_ref(p, q.data(), ql, kv.data(), kl, kv.data(), vl, out_ref.data(), lse_ref.data());
  f.attention_forward(p, q.data(), ql, kv.data(), kl, kv.data(), vl, out.data(), lse.data());
  EXPECT_LE(peak_rel_error(out, out_ref), kAttentionTol);
  // lse: −inf exactly where the reference has it (rows that see no key), close elsewhere.
  double lse_err = 0.0;
  for (int64_t i = 0; i < lse_n; ++i) {
    if (std::isinf(lse_ref[i])) {
      EXPECT_EQ(lse[i], lse_ref[i]) << i;
    } else {
      lse_err = std::max(lse_err,
                         std::fabs(static_cast<double>(lse[i]) - lse_ref[i]) / std::max(1.0f, std::fabs(lse_ref[i])));
    }
  }
  EXPECT_LE(lse_err, kAttentionTol);

  auto dout = random_vector(out_n, 93);
  std::vector<float> dq_ref(q.size()), dkv_ref(kv.size()), dq(q.size(), 7.0f), dkv(kv.size(), 7.0f);
  attention_backward_ref(p, q.data(), ql, kv.data(), kl, kv.data(), vl, out_ref.data(), lse_ref.data(), dout.data(),
                         dq_ref.data(), dkv_ref.data(), dkv_ref.data());
  f.attention_backward(p, q.data(), ql, kv.data(), kl, kv.data(), vl, out_ref.data(), lse_ref.data(), dout.data(),
                       dq.data(), dkv.data(), dkv.data());
  // Inputs are O(1): gradients are judged against max(peak, 1) (for T = 1, dq is 0 up to rounding).
  EXPECT_LE(peak_rel_error(dq, dq_ref, 1.0), kAttentionTol);
  EXPECT_LE(peak_rel_error(dkv, dkv_ref, 1.0), kAttentionTol);
}

// A sliding window makes the kernels skip every key tile the window hides from a whole query
// tile: its keys and values are never read. NaN in them would reach the outputs through the tile
// products otherwise (0·NaN), masked or not.
TEST_P(FusedVsReference, FlashAttentionWindowSkipsKeyTilesBehindIt) {
  const FusedKernelSet& f = *fused_kernel_set(GetParam());
  const int64_t Sq = 64, Sk = 256, NH = 2, KV = 1, HD = 16, W = 16;
  const int64_t q_row = NH * HD, kv_row = 2 * KV * HD;
  auto q = random_vector(Sq * q_row, 81), kv = random_vector(Sk * kv_row, 82);
  // Queries at positions 192..255 see keys 177..255: key tiles 0 and 1 (positions 0..127) are hidden.
  std::vector<float> poisoned = kv;
  for (int64_t j = 0; j < 128; ++j)
    for (int64_t c = 0; c < kv_row; ++c) poisoned[j * kv_row + c] = std::numeric_limits<float>::quiet_NaN();
  std::vector<int32_t> qpos(Sq);
  for (int64_t i = 0; i < Sq; ++i) qpos[i] = static_cast<int32_t>(Sk - Sq + i);
  AttentionProblem p;
  p.B = 1;
  p.Sq = Sq;
  p.Sk = Sk;
  p.NH = NH;
  p.KV = KV;
  p.HD = HD;
  p.scale = 0.25f;
  p.window = W;
  p.q_positions = qpos.data();
  const HeadLayout ql = contiguous_heads_layout(NH, HD);
  const HeadLayout kl{kv_row, 0, 1, 2 * HD, 0}, vl{kv_row, HD, 1, 2 * HD, 0};
  std::vector<float> out_ref(Sq * q_row), lse_ref(NH * Sq), out(out_ref.size()), lse(lse_ref.size());
  attention_forward_ref(p, q.data(), ql, kv.data(), kl, kv.data(), vl, out_ref.data(), lse_ref.data());
  f.attention_forward(p, q.data(), ql, poisoned.data(), kl, poisoned.data(), vl, out.data(), lse.data());
  EXPECT_LE(peak_rel_error(out, out_ref), kAttentionTol);
  auto dout = random_vector(out.size(), 83);
  std::vector<float> dq_ref(q.size()), dkv_ref(kv.size()), dq(q.size()), dkv(kv.size(), 7.0f);
  attention_backward_ref(p, q.data(), ql, kv.data(), kl, kv.data(), vl, out_ref.data(), lse_ref.data(), dout.data(),
                         dq_ref.data(), dkv_ref.data(), dkv_ref.data());
  f.attention_backward(p, q.data(), ql, poisoned.data(), kl, poisoned.data(), vl, out_ref.data(), lse_ref.data(),
                       dout.data(), dq.data(), dkv.data(), dkv.data());
  EXPECT_LE(peak_rel_error(dq, dq_ref, 1.0), kAttentionTol);
  EXPECT_LE(peak_rel_error(dkv, dkv_ref, 1.0), kAttentionTol);  // zeros for the hidden keys
}

TEST(FlashAttention, PackedQkvLayoutAsTheModelCallsIt) {
  // q, k, v read in place from Megatron's packed QKV rows; dq, dk, dv written into one d_qkv buffer.
  const int64_t B = 2, S = 90, NH = 6, KV = 2, HD = 16, row = (NH + 2 * KV) * HD;
  auto qkv = random_vector(S * B * row, 101);
  std::vector<int64_t> samples = {3, 4};
  AttentionProblem p;
  p.B = B;
  p.Sq = p.Sk = S;
  p.NH = NH;
  p.KV = KV;
  p.HD = HD;
  p.scale = 0.25f;
  p.dropout_p = 0.1f;
  p.dropout_seed = 1;
  p.sample_ids = samples.data();
  p.heads_total = NH;
  p.max_positions = S;
  const HeadLayout ql = qkv_query_layout(NH, KV, HD), kl = qkv_key_layout(NH, KV, HD),
                   vl = qkv_value_layout(NH, KV, HD);
  std::vector<float> out_ref(S * B * NH * HD), lse_ref(B * NH * S), dqkv_ref(qkv.size());
  auto dout = random_vector(static_cast<int64_t>(out_ref.size()), 102);
  attention_forward_ref(p, qkv.data(), ql, qkv.data(), kl, qkv.data(), vl, out_ref.data(), lse_ref.data());
  attention_backward_ref(p, qkv.data(), ql, qkv.data(), kl, qkv.data(), vl, out_ref.data(), lse_ref.data(), dout.data(),
                         dqkv_ref.data(), dqkv_ref.data(), dqkv_ref.data());
  for (Isa isa : runnable_isas()) {
    SCOPED_TRACE(isa_name(isa));
    const FusedKernelSet& f = *fused_kernel_set(isa);
    std::vector<float> out(out_ref.size()), lse(lse_ref.size()), dqkv(qkv.size(), -1.0f);
    f.attention_forward(p, qkv.data(), ql, qkv.data(), kl, qkv.data(), vl, out.data(), lse.data());
    f.attention_backward(p, qkv.data(), ql, qkv.data(), kl, qkv.data(), vl, out.data(), lse.data(), dout.data(),
                         dqkv.data(), dqkv.data(), dqkv.data());
    EXPECT_LE(peak_rel_error(out, out_ref), kAttentionTol);
    EXPECT_LE(peak_rel_error(dqkv, dqkv_ref), kAttentionTol);
  }
}

// A NaN in one query makes that query's output and lse NaN, so training's NaN checks see it; the
// other queries are unaffected. (The reference instead returns 0 and lse = −inf for that row:
// its row max skips NaN. The fused kernels deliberately differ here.)
TEST(FlashAttention, NanQueryGivesNanRowOnly) {
  const int64_t S = 70, NH = 2, HD = 16, row = 3 * NH * HD, bad_token = 5;
  auto qkv = random_vector(S * row, 103);
  AttentionProblem p;
  p.B = 1;
  p.Sq = p.Sk = S;
  p.NH = p.KV = NH;
  p.HD = HD;
  p.scale = 0.25f;
  p.max_positions = S;
  const HeadLayout ql = qkv_query_layout(NH, NH, HD), kl = qkv_key_layout(NH, NH, HD),
                   vl = qkv_value_layout(NH, NH, HD);
  std::vector<float> out_ref(S * NH * HD), lse_ref(NH * S);
  attention_forward_ref(p, qkv.data(), ql, qkv.data(), kl, qkv.data(), vl, out_ref.data(), lse_ref.data());
  qkv[ql.offset(bad_token, 0) + 3] = NAN;  // one element of token 5's head-0 query
  for (Isa isa : runnable_isas()) {
    SCOPED_TRACE(isa_name(isa));
    std::vector<float> out(out_ref.size()), lse(lse_ref.size());
    fused_kernel_set(isa)->attention_forward(p, qkv.data(), ql, qkv.data(), kl, qkv.data(), vl, out.data(), lse.data());
    for (int64_t t = 0; t < S; ++t)
      for (int64_t h = 0; h < NH; ++h) {
        const bool bad = t == bad_token && h == 0;
        EXPECT_EQ(std::isnan(lse[h * S + t]), bad) << t << " " << h;
        for (int64_t c = 0; c < HD; ++c) {
          const float o = out[(t * NH + h) * HD + c];
          if (bad)
            EXPECT_TRUE(std::isnan(o));
          else
            EXPECT_NEAR(o, out_ref[(t * NH + h) * HD + c], 1e-5f);
        }
      }
  }
}

// ---------------------------------------------------------------- LM head + cross-entropy

struct LmCase {
  int64_t T, H, V, slices, chunk_tokens;  // chunk_tokens 0: the automatic chunk
};

// Sets the LM head's chunk size for one scope.
class ChunkTokens {
 public:
  explicit ChunkTokens(int64_t tokens) { set_lm_head_chunk_tokens(tokens); }
  ~ChunkTokens() { set_lm_head_chunk_tokens(0); }
};

TEST_P(FusedVsReference, LmHeadLossRecomputePathAndVocabSlices) {
  for (const LmCase& c : {LmCase{1, 8, 50, 1, 0}, LmCase{37, 33, 1000, 1, 8}, LmCase{64, 48, 3001, 2, 16},
                          LmCase{50, 16, 4000, 4, 7}, LmCase{40, 24, 6000, 1, 0}}) {
    const ChunkTokens chunk(c.chunk_tokens);
    const int64_t Vl = c.V / c.slices;
    for (int64_t slice = 0; slice < c.slices; ++slice) {
      SCOPED_TRACE(::testing::Message() << "T " << c.T << " H " << c.H << " V " << c.V << " slice " << slice
                                        << " chunk " << c.chunk_tokens);
      auto x = random_vector(c.T * c.H, 111, 2.0f), W = random_vector(Vl * c.H, 112 + slice);
      std::vector<int32_t> targets(c.T);
      for (int64_t t = 0; t < c.T; ++t) targets[t] = static_cast<int32_t>((t * 7919) % (Vl * c.slices));
      LmHeadProblem p{c.T, c.H, Vl, slice * Vl, x.data(), W.data(), targets.data(), c.slices == 1, nullptr, nullptr};
      std::vector<float> st_ref(3 * c.T), st(3 * c.T);
      Tensor saved_ref, saved;
      ref_.lm_head_loss_forward(p, st_ref.data(), st_ref.data() + c.T, st_ref.data() + 2 * c.T, &saved_ref);
      fused().lm_head_loss_forward(p, st.data(), st.data() + c.T, st.data() + 2 * c.T, &saved);
      EXPECT_FALSE(saved.defined());                                         // nothing kept: backward recomputes
      EXPECT_LE(peak_rel_error(st.data(), st_ref.data(), c.T), kLmHeadTol);  // max
      EXPECT_LE(peak_rel_error(st.data() + c.T, st_ref.data() + c.T, c.T), kLmHeadTol);          // Σexp
      EXPECT_LE(peak_rel_error(st.data() + 2 * c.T, st_ref.data() + 2 * c.T, c.T), kLmHeadTol);  // target
      // Backward with a made-up global lse (as after the TP merge) and a loss mask.
      std::vector<float> lse(c.T), dloss(c.T);
      for (int64_t t = 0; t < c.T; ++t) {
        lse[t] = st_ref[t] + std::log(st_ref[c.T + t]) + 0.3f;
        dloss[t] = (t % 5 == 0) ? 0.0f : 1.0f / c.T;
      }
      auto dW0 = random_vector(Vl * c.H, 113, 1e-3f);
      std::vector<float> dx_ref(c.T * c.H), dx(c.T * c.H), dW_ref = dW0, dW = dW0;
      ref_.lm_head_loss_backward(p, lse.data(), dloss.data(), dx_ref.data(), dW_ref.data(), &saved_ref);
      fused().lm_head_loss_backward(p, lse.data(), dloss.data(), dx.data(), dW.data(), &saved);
      EXPECT_LE(peak_rel_error(dx, dx_ref), kLmHeadTol);
      EXPECT_LE(peak_rel_error(dW, dW_ref), kLmHeadTol);
    }
  }
}

TEST_P(FusedVsReference, LmHeadLossEagerBackwardInForward) {
  for (const LmCase& c :
       {LmCase{1, 8, 50, 1, 0}, LmCase{45, 20, 999, 1, 10}, LmCase{64, 24, 3000, 1, 16}, LmCase{40, 24, 6000, 1, 0}}) {
    const ChunkTokens chunk(c.chunk_tokens);
    SCOPED_TRACE(::testing::Message() << "T " << c.T << " H " << c.H << " V " << c.V << " chunk " << c.chunk_tokens);
    auto x = random_vector(c.T * c.H, 121, 2.0f), W = random_vector(c.V * c.H, 122);
    std::vector<int32_t> targets(c.T);
    for (int64_t t = 0; t < c.T; ++t) targets[t] = static_cast<int32_t>((t * 31 + 5) % c.V);
    std::vector<float> dloss(c.T);
    for (int64_t t = 0; t < c.T; ++t) dloss[t] = (t % 3 == 0) ? 0.0f : 0.5f / c.T;
    auto dW0 = random_vector(c.V * c.H, 123, 1e-3f);
    std::vector<float> dW_ref = dW0, dW = dW0;
    // Reference: forward, merge, backward.
    LmHeadProblem p_ref{c.T, c.H, c.V, 0, x.data(), W.data(), targets.data(), true, nullptr, nullptr};
    std::vector<float> st_ref(3 * c.T), lse(c.T), dx_ref(c.T * c.H);
    Tensor saved_ref;
    ref_.lm_head_loss_forward(p_ref, st_ref.data(), st_ref.data() + c.T, st_ref.data() + 2 * c.T, &saved_ref);
    for (int64_t t = 0; t < c.T; ++t) lse[t] = st_ref[t] + std::log(st_ref[c.T + t]);
    ref_.lm_head_loss_backward(p_ref, lse.data(), dloss.data(), dx_ref.data(), dW_ref.data(), &saved_ref);
    // Eager: dloss and dW given at forward time; backward only hands dx over.
    LmHeadProblem p{c.T, c.H, c.V, 0, x.data(), W.data(), targets.data(), true, dloss.data(), dW.data()};
    std::vector<float> st(3 * c.T), dx(c.T * c.H);
    Tensor saved;
    fused().lm_head_loss_forward(p, st.data(), st.data() + c.T, st.data() + 2 * c.T, &saved);
    EXPECT_TRUE(saved.defined());
    EXPECT_LE(peak_rel_error(dW, dW_ref), kLmHeadTol);  // already accumulated by forward
    EXPECT_LE(peak_rel_error(st.data() + c.T, st_ref.data() + c.T, c.T), kLmHeadTol);
    fused().lm_head_loss_backward(p, lse.data(), dloss.data(), dx.data(), dW.data(), &saved);
    EXPECT_FALSE(saved.defined());
    EXPECT_LE(peak_rel_error(dx, dx_ref), kLmHeadTol);
    EXPECT_LE(peak_rel_error(dW, dW_ref), kLmHeadTol);
  }
}

TEST_P(FusedVsReference, LmHeadEvaluationForwardKeepsNothing) {
  const int64_t T = 10, H = 8, V = 100;
  auto x = random_vector(T * H, 131), W = random_vector(V * H, 132);
  std::vector<int32_t> targets(T, 3);
  std::vector<float> st(3 * T), st_ref(3 * T);
  LmHeadProblem p{T, H, V, 0, x.data(), W.data(), targets.data(), true, nullptr, nullptr};
  fused().lm_head_loss_forward(p, st.data(), st.data() + T, st.data() + 2 * T, nullptr);
  ref_.lm_head_loss_forward(p, st_ref.data(), st_ref.data() + T, st_ref.data() + 2 * T, nullptr);
  EXPECT_LE(peak_rel_error(st, st_ref), kLmHeadTol);
}

using FusedDeathTest = FusedVsReference;
TEST_P(FusedDeathTest, EagerLmHeadRejectsADifferentDlossInBackward) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // OpenMP threads exist: re-execute, don't just fork
  const int64_t T = 4, H = 4, V = 10;
  auto x = random_vector(T * H, 141), W = random_vector(V * H, 142);
  std::vector<int32_t> targets = {1, 2, 3, 4};
  std::vector<float> dloss(T, 0.25f), other(T, 0.5f), dW(V * H), st(3 * T), lse(T), dx(T * H);
  LmHeadProblem p{T, H, V, 0, x.data(), W.data(), targets.data(), true, dloss.data(), dW.data()};
  Tensor saved;
  fused().lm_head_loss_forward(p, st.data(), st.data() + T, st.data() + 2 * T, &saved);
  EXPECT_DEATH(fused().lm_head_loss_backward(p, lse.data(), other.data(), dx.data(), dW.data(), &saved),
               "dloss differs from the dloss its forward used");
}

INSTANTIATE_TEST_SUITE_P(Isas, FusedVsReference, ::testing::ValuesIn(runnable_isas()), isa_test_name);
INSTANTIATE_TEST_SUITE_P(Isas, FusedDeathTest, ::testing::ValuesIn(runnable_isas()), isa_test_name);
INSTANTIATE_TEST_SUITE_P(Cases, FlashVsReference,
                         ::testing::Combine(::testing::ValuesIn(runnable_isas()), ::testing::ValuesIn(kAttnCases)),
                         [](const ::testing::TestParamInfo<std::tuple<Isa, AttnCase>>& info) {
                           return std::string(isa_name(std::get<0>(info.param))) + "_" + std::get<1>(info.param).name;
                         });

// ---------------------------------------------------------------- installation API

TEST(InstallFusedKernel, EveryOpGroupAndItsName) {
  OpTable t = reference_ops();
  const Isa want = min_isa(Isa::kAvx512, detected_isa());
  for (const std::string& op : fused_kernel_ops()) {
    ASSERT_EQ(t.impl.count(op), 1u) << op;  // the op groups are exactly OpTable::impl's keys
    EXPECT_EQ(fused_kernel_isa(op, Isa::kAvx512).value(), want);
    EXPECT_TRUE(install_fused_kernel(t, op, Isa::kAvx512).ok());
    EXPECT_EQ(t.impl[op], fused_kernel_name(op, want));
  }
  EXPECT_EQ(fused_kernel_ops().size(), t.impl.size());
  const FusedKernelSet& s = *fused_kernel_set(want);
  EXPECT_EQ(t.attention_forward, s.attention_forward);
  EXPECT_EQ(t.norm_backward, s.norm_backward);
  EXPECT_EQ(t.lm_head_loss_backward, s.lm_head_loss_backward);
  EXPECT_EQ(t.adamw_step, s.adamw_step);
  EXPECT_EQ(t.ema_adamw_step, s.ema_adamw_step);
  EXPECT_EQ(t.bias_dropout_add_norm, s.bias_dropout_add_norm);
  EXPECT_EQ(t.gemm, &sgemm_partitioned);
  EXPECT_EQ(t.impl["gemm"], "partitioned");
}

TEST(InstallFusedKernel, CapAndErrors) {
  OpTable t = reference_ops();
  EXPECT_TRUE(install_fused_kernel(t, "rope", Isa::kScalar).ok());
  EXPECT_EQ(t.impl["rope"], "fused-scalar");
  EXPECT_EQ(t.rope_forward, fused_kernel_set(Isa::kScalar)->rope_forward);
  EXPECT_EQ(t.impl["norm"], "reference");  // other groups untouched
  Status st = install_fused_kernel(t, "softmax", Isa::kAvx512);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("found 'softmax'"), std::string::npos);
  EXPECT_FALSE(fused_kernel_isa("softmax", Isa::kAvx2).ok());
  setenv("GALE_MAX_ISA", "scalar", 1);
  EXPECT_EQ(fused_kernel_isa("attention", Isa::kAvx512).value(), Isa::kScalar);
  unsetenv("GALE_MAX_ISA");
  EXPECT_TRUE(install_all_fused_kernels(t, Isa::kAvx2).ok());
  for (const auto& [op, name] : t.impl) EXPECT_EQ(name, fused_kernel_name(op, min_isa(Isa::kAvx2, detected_isa())));
}

}  // namespace
}  // namespace gale
