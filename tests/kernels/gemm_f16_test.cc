// f16 GEMM against a double-precision product of the same halves, and the vectorised (F16C)
// f32 <-> f16 conversions bit for bit against core/dtype.h, for every ISA this CPU has.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "fused_test_util.h"
#include "kernels/cpu/gemm.h"
#include "testing.h"

namespace gale {
namespace {

using testing::random_vector;
using testing::runnable_isas;

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

class ForceIsa {
 public:
  explicit ForceIsa(Isa isa) { setenv("GALE_MAX_ISA", isa_name(isa), 1); }
  ~ForceIsa() { unsetenv("GALE_MAX_ISA"); }
};

// Edges of the half range, every half's neighbourhood (its value, the midpoints to the next one
// and a float on either side of them), and random floats over all exponents.
std::vector<float> conversion_inputs() {
  std::vector<float> v = {0.0f, -0.0f, 65504.0f, 65519.996f, 65520.0f, -65520.0f, 1e9f, INFINITY, -INFINITY, NAN,
                          from_bits(0x7f800001u), from_bits(0xffc12345u), std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::denorm_min(), 0x1p-25f, -0x1p-25f, 0x1.8p-25f};
  for (uint32_t bits = 0; bits < 0x7c00; bits += 7) {
    const float a = f16_to_float(f16{static_cast<uint16_t>(bits)}), b = f16_to_float(f16{static_cast<uint16_t>(bits + 1)});
    const float mid = (a + b) / 2;
    for (float x : {a, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
      v.push_back(x);
      v.push_back(-x);
    }
  }
  for (uint32_t i = 0; i < 5000; ++i) v.push_back(from_bits(i * 858993u + 12345u * (i & 7)));
  auto r = random_vector(333, 7, 100.0f);
  v.insert(v.end(), r.begin(), r.end());
  return v;
}

class F16Convert : public ::testing::TestWithParam<Isa> {};

TEST_P(F16Convert, MatchesDtypeBitForBit) {
  const ForceIsa force(GetParam());
  ASSERT_EQ(detected_isa(), GetParam());
  const std::vector<float> x = conversion_inputs();
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{15}, int64_t{17}, static_cast<int64_t>(x.size())}) {
    std::vector<f16> y(n);
    convert_f32_to_f16(x.data(), y.data(), n);
    int64_t mismatches = 0;
    for (int64_t i = 0; i < n; ++i) {
      const bool same = y[i].bits == float_to_f16(x[i]).bits;
      mismatches += !same;
      if (!same && mismatches < 5) ADD_FAILURE() << "x " << x[i] << " kernel " << y[i].bits << " dtype.h " << float_to_f16(x[i]).bits;
    }
    EXPECT_EQ(mismatches, 0) << "n " << n;
    std::vector<float> back(n, 5.0f);
    convert_f16_to_f32(y.data(), back.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const float ref = f16_to_float(y[i]);
      ASSERT_EQ(std::memcmp(&back[i], &ref, 4), 0) << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isas, F16Convert, ::testing::ValuesIn(runnable_isas()),
                         [](const ::testing::TestParamInfo<Isa>& info) { return std::string(isa_name(info.param)); });

TEST(GemmF16, AllTransposesStridesAlphaBeta) {
  struct Case {
    int64_t M, N, K;
    float alpha, beta;
  };
  for (const Case& c : {Case{1, 1, 1, 1.0f, 0.0f}, Case{17, 33, 65, 1.0f, 0.0f}, Case{64, 48, 128, 0.5f, 1.0f},
                        Case{5, 130, 7, -2.0f, 0.25f}})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        SCOPED_TRACE(::testing::Message() << c.M << "x" << c.N << "x" << c.K << " ta " << ta << " tb " << tb);
        const int64_t lda = (ta ? c.M : c.K) + 3, ldb = (tb ? c.K : c.N) + 1, ldc = c.N + 2;
        const int64_t a_rows = ta ? c.K : c.M, b_rows = tb ? c.N : c.K;
        auto af = random_vector(a_rows * lda, 1), bf = random_vector(b_rows * ldb, 2), cf = random_vector(c.M * ldc, 3);
        std::vector<f16> A(af.size()), B(bf.size());
        convert_f32_to_f16(af.data(), A.data(), static_cast<int64_t>(af.size()));
        convert_f32_to_f16(bf.data(), B.data(), static_cast<int64_t>(bf.size()));
        std::vector<double> ref(cf.begin(), cf.end());
        for (int64_t m = 0; m < c.M; ++m)
          for (int64_t n = 0; n < c.N; ++n) {
            double s = 0.0;
            for (int64_t k = 0; k < c.K; ++k)
              s += static_cast<double>(f16_to_float(ta ? A[k * lda + m] : A[m * lda + k])) *
                   f16_to_float(tb ? B[n * ldb + k] : B[k * ldb + n]);
            ref[m * ldc + n] = c.alpha * s + c.beta * ref[m * ldc + n];
          }
        std::vector<float> C = cf;
        gemm_f16(sgemm, ta, tb, c.M, c.N, c.K, c.alpha, A.data(), lda, B.data(), ldb, c.beta, C.data(), ldc);
        double err = 0.0, peak = 1e-30;
        for (int64_t m = 0; m < c.M; ++m)
          for (int64_t n = 0; n < c.N; ++n) {
            err = std::max(err, std::fabs(C[m * ldc + n] - ref[m * ldc + n]));
            peak = std::max(peak, std::fabs(ref[m * ldc + n]));
          }
        EXPECT_LE(err / peak, 1e-5);  // f32 accumulation of exact f16 products
        for (int64_t m = 0; m < c.M; ++m)
          for (int64_t n = c.N; n < ldc; ++n) EXPECT_EQ(C[m * ldc + n], cf[m * ldc + n]);  // padding untouched
      }
}

}  // namespace
}  // namespace gale
