// The fused GeGLU kernels (kernels/cpu/fused_geglu.h) against the level-0 reference (kernels/cpu/geglu.h), for
// both GeLU forms and every ISA build this machine can run, and the lookup of the build an OpTable names.
#include "kernels/cpu/fused_geglu.h"

#include <gtest/gtest.h>

#include <cmath>
#include <tuple>
#include <vector>

#include "kernels/fused_test_util.h"
#include "testing.h"

namespace gale {
namespace {

using testing::bit_differences;
using testing::peak_rel_error;
using testing::random_vector;
using testing::runnable_isas;

// max |fused − reference| / max |reference| over each output array, as for the other activations in
// tests/kernels/fused_vs_reference_test.cc (vector erf/exp ≤ 2.5 ulp inside the GeLU) [measured: erf 1.9e-7,
// tanh 4.6e-7, mostly the reference's own 1 − tanh² cancellation].
constexpr double kGegluTol = 1e-6;

struct Shape {
  int64_t rows, F;
};
const Shape kShapes[] = {{1, 1}, {3, 7}, {16, 3072}, {5, 33}, {9, 100}, {2, 17}};

class FusedGeglu : public ::testing::TestWithParam<std::tuple<Isa, GegluGate>> {
 protected:
  Isa isa() const { return std::get<0>(GetParam()); }
  GegluGate gate() const { return std::get<1>(GetParam()); }
  const GegluKernels& fused() const { return *fused_geglu_kernels(isa()); }
};

TEST_P(FusedGeglu, ForwardAndBackwardMatchTheReference) {
  for (const Shape& sh : kShapes)
    for (bool bias : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "rows " << sh.rows << " F " << sh.F << " bias " << bias);
      const int64_t n = sh.rows * sh.F;
      // Scale 5: gates well into both tails (GeLU ≈ 0 and ≈ identity), where the forms differ most.
      auto u0 = random_vector(2 * n, 61, 5.0f), bvec = random_vector(2 * sh.F, 62), dact = random_vector(n, 63);
      std::vector<float> u_ref = u0, u = u0, a_ref(n), a(n);
      geglu_forward_ref(gate(), u_ref.data(), bias ? bvec.data() : nullptr, a_ref.data(), sh.rows, sh.F);
      fused().forward(gate(), u.data(), bias ? bvec.data() : nullptr, a.data(), sh.rows, sh.F);
      EXPECT_EQ(bit_differences(u, u_ref), 0);  // the bias is added to u in place, exactly
      EXPECT_LE(peak_rel_error(a, a_ref), kGegluTol);
      auto db0 = random_vector(2 * sh.F, 64);
      std::vector<float> du_ref(2 * n), du(2 * n, 123.0f), db_ref = db0, db = db0;
      geglu_backward_ref(gate(), dact.data(), u_ref.data(), du_ref.data(), bias ? db_ref.data() : nullptr, sh.rows,
                         sh.F);
      fused().backward(gate(), dact.data(), u_ref.data(), du.data(), bias ? db.data() : nullptr, sh.rows, sh.F);
      // Both halves: the gate's gradient (gelu') and the linear half's (gelu).
      EXPECT_LE(peak_rel_error(du, du_ref), kGegluTol);
      for (int64_t r = 0; r < sh.rows; ++r) {
        const int64_t off = r * 2 * sh.F;
        EXPECT_LE(peak_rel_error(du.data() + off, du_ref.data() + off, sh.F), kGegluTol) << "gate half, row " << r;
        EXPECT_LE(peak_rel_error(du.data() + off + sh.F, du_ref.data() + off + sh.F, sh.F), kGegluTol)
            << "linear half, row " << r;
      }
      EXPECT_LE(peak_rel_error(db, db_ref), kGegluTol);
      if (!bias) {
        EXPECT_EQ(bit_differences(db, db0), 0);  // no dbias: untouched
      }
    }
}

// Saturated gates: GeLU(−40) = −0 and GeLU(40) = 40 (gradients 0 and 1), GeLU(0) = 0 with slope ½; NaN
// propagates to its own outputs only.
TEST_P(FusedGeglu, SaturationZeroAndNan) {
  const std::vector<float> gates = {-40.0f, 40.0f, 0.0f, -0.0f, NAN, 3.0f, -3.0f, 0.5f};
  const int64_t F = static_cast<int64_t>(gates.size());
  std::vector<float> u = gates;
  u.resize(2 * F, 2.0f);  // linear half: 2
  std::vector<float> u_ref = u, a(F), a_ref(F), dact(F, 1.0f), du(2 * F), du_ref(2 * F);
  fused().forward(gate(), u.data(), nullptr, a.data(), 1, F);
  geglu_forward_ref(gate(), u_ref.data(), nullptr, a_ref.data(), 1, F);
  fused().backward(gate(), dact.data(), u.data(), du.data(), nullptr, 1, F);
  geglu_backward_ref(gate(), dact.data(), u_ref.data(), du_ref.data(), nullptr, 1, F);
  for (int64_t i = 0; i < F; ++i) {
    SCOPED_TRACE(::testing::Message() << "gate " << gates[i]);
    if (std::isnan(gates[i])) {
      EXPECT_TRUE(std::isnan(a[i]));
      EXPECT_TRUE(std::isnan(du[i]));
      EXPECT_TRUE(std::isnan(du[F + i]));
      continue;
    }
    EXPECT_NEAR(a[i], a_ref[i], 1e-6f * std::max(1.0f, std::fabs(a_ref[i])));
    EXPECT_NEAR(du[i], du_ref[i], 1e-6f * std::max(1.0f, std::fabs(du_ref[i])));
    EXPECT_NEAR(du[F + i], du_ref[F + i], 1e-6f * std::max(1.0f, std::fabs(du_ref[F + i])));
  }
  EXPECT_EQ(a[0], 0.0f);
  EXPECT_EQ(a[1], 80.0f);
  EXPECT_EQ(du[0], 0.0f);
  EXPECT_EQ(du[1], 2.0f);
  EXPECT_NEAR(du[2], 1.0f, 1e-7f);  // 2·gelu'(0) = 2·½
}

std::string param_name(const ::testing::TestParamInfo<std::tuple<Isa, GegluGate>>& info) {
  return std::string(isa_name(std::get<0>(info.param))) +
         (std::get<1>(info.param) == GegluGate::kErf ? "_erf" : "_tanh");
}

INSTANTIATE_TEST_SUITE_P(IsasAndGates, FusedGeglu,
                         ::testing::Combine(::testing::ValuesIn(runnable_isas()),
                                            ::testing::Values(GegluGate::kErf, GegluGate::kTanh)),
                         param_name);

// The model's lookup (model/mlp_activation.h): the reference at level 0, the build install_fused_kernel names.
TEST(GegluKernels, TheOpTableNamesTheBuild) {
  OpTable t = reference_ops();
  EXPECT_EQ(t.impl["geglu"], "reference");
  GegluKernels k = geglu_kernels(t);
  EXPECT_EQ(k.isa, nullptr);
  EXPECT_EQ(k.forward, &geglu_forward_ref);
  EXPECT_EQ(k.backward, &geglu_backward_ref);
  for (Isa isa : runnable_isas()) {
    SCOPED_TRACE(isa_name(isa));
    ASSERT_TRUE(install_fused_kernel(t, "geglu", isa).ok());
    const Isa want = min_isa(isa, detected_isa());
    EXPECT_EQ(t.impl["geglu"], fused_kernel_name("geglu", want));
    k = geglu_kernels(t);
    EXPECT_STREQ(k.isa, isa_name(want));
    EXPECT_EQ(k.forward, fused_geglu_kernels(want)->forward);
    EXPECT_EQ(k.backward, fused_geglu_kernels(want)->backward);
    EXPECT_NE(k.forward, &geglu_forward_ref);
  }
  t.impl.erase("geglu");  // a table without the entry: the reference
  EXPECT_EQ(geglu_kernels(t).forward, &geglu_forward_ref);
}

}  // namespace
}  // namespace gale
