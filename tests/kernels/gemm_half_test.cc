// bf16 and f16 GEMMs against a double-precision product of the same inputs, and the vectorised
// f32 <-> bf16 and f32 <-> f16 (F16C) conversions bit for bit against core/dtype.h, for every ISA
// this CPU has.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
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

// Forces one ISA for the conversions for the lifetime of the object.
class ForceIsa {
 public:
  explicit ForceIsa(Isa isa) { setenv("GALE_MAX_ISA", isa_name(isa), 1); }
  ~ForceIsa() { unsetenv("GALE_MAX_ISA"); }
};

std::vector<float> conversion_inputs() {
  std::vector<float> v = {0.0f,
                          -0.0f,
                          1.0f,
                          -1.0f,
                          std::numeric_limits<float>::max(),
                          -std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::min(),
                          std::numeric_limits<float>::denorm_min(),
                          INFINITY,
                          -INFINITY,
                          NAN,
                          -NAN,
                          from_bits(0x7f800001u),
                          from_bits(0xffc12345u),
                          from_bits(0x7fbfffffu),
                          from_bits(0x3f808000u),  // tie, even lower half: rounds down
                          from_bits(0x3f818000u),  // tie, odd: rounds up
                          from_bits(0x3f80ffffu),
                          from_bits(0x7f7fffffu),
                          from_bits(0x00008000u),
                          from_bits(0x807fffffu)};
  for (uint32_t i = 0; i < 5000; ++i)
    v.push_back(from_bits(i * 858993u + 12345u * (i & 7)));  // spread over all exponents
  auto r = random_vector(333, 7, 100.0f);
  v.insert(v.end(), r.begin(), r.end());
  return v;
}

class Bf16Convert : public ::testing::TestWithParam<Isa> {};

TEST_P(Bf16Convert, MatchesDtypeBitForBit) {
  const ForceIsa force(GetParam());
  ASSERT_EQ(detected_isa(), GetParam());
  const std::vector<float> x = conversion_inputs();
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{15}, int64_t{17}, static_cast<int64_t>(x.size())}) {
    std::vector<bf16> y(n);
    convert_f32_to_bf16(x.data(), y.data(), n);
    int64_t mismatches = 0;
    for (int64_t i = 0; i < n; ++i) mismatches += y[i].bits != float_to_bf16(x[i]).bits;
    EXPECT_EQ(mismatches, 0) << "n " << n;
    std::vector<float> back(n, 5.0f);
    convert_bf16_to_f32(y.data(), back.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const float ref = bf16_to_float(y[i]);
      ASSERT_EQ(std::memcmp(&back[i], &ref, 4), 0) << i;
    }
  }
  // A bf16 value survives the round trip exactly.
  std::vector<float> exact = {1.5f, -2.25f, 65536.0f, 0.0078125f};
  std::vector<bf16> h(exact.size());
  std::vector<float> again(exact.size());
  convert_f32_to_bf16(exact.data(), h.data(), 4);
  convert_bf16_to_f32(h.data(), again.data(), 4);
  EXPECT_EQ(again, exact);
}

INSTANTIATE_TEST_SUITE_P(Isas, Bf16Convert, ::testing::ValuesIn(runnable_isas()),
                         [](const ::testing::TestParamInfo<Isa>& info) { return std::string(isa_name(info.param)); });

float widen(bf16 v) { return bf16_to_float(v); }
float widen(f16 v) { return f16_to_float(v); }
void narrow(const float* x, bf16* y, int64_t n) { convert_f32_to_bf16(x, y, n); }
void narrow(const float* x, f16* y, int64_t n) { convert_f32_to_f16(x, y, n); }

// C = alpha·op(A)·op(B) + beta·C in double from the half (bf16 or f16) values.
template <class T>
void reference(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const std::vector<T>& A, int64_t lda,
               const std::vector<T>& B, int64_t ldb, float beta, std::vector<double>& C, int64_t ldc) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const double a = widen(ta ? A[k * lda + m] : A[m * lda + k]);
        const double b = widen(tb ? B[n * ldb + k] : B[k * ldb + n]);
        s += a * b;
      }
      C[m * ldc + n] = alpha * s + beta * C[m * ldc + n];
    }
}

// A half GEMM (gemm_bf16_via, gemm_f16) with sgemm's conventions.
template <class T>
using HalfGemm = std::function<void(bool, bool, int64_t, int64_t, int64_t, float, const T*, int64_t, const T*, int64_t,
                                    float, float*, int64_t)>;

// Every transpose, padded strides, alpha and beta: within f32 accumulation of the exact products of
// the double reference, with C's padding columns untouched.
template <class T>
void expect_matches_reference(const HalfGemm<T>& gemm) {
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
        std::vector<T> A(af.size()), B(bf.size());
        narrow(af.data(), A.data(), static_cast<int64_t>(af.size()));
        narrow(bf.data(), B.data(), static_cast<int64_t>(bf.size()));
        std::vector<double> ref(cf.begin(), cf.end());
        reference(ta, tb, c.M, c.N, c.K, c.alpha, A, lda, B, ldb, c.beta, ref, ldc);
        std::vector<float> C = cf;
        gemm(ta, tb, c.M, c.N, c.K, c.alpha, A.data(), lda, B.data(), ldb, c.beta, C.data(), ldc);
        double err = 0.0, peak = 1e-30;
        for (int64_t m = 0; m < c.M; ++m)
          for (int64_t n = 0; n < c.N; ++n) {
            err = std::max(err, std::fabs(C[m * ldc + n] - ref[m * ldc + n]));
            peak = std::max(peak, std::fabs(ref[m * ldc + n]));
          }
        EXPECT_LE(err / peak, 1e-5);
        for (int64_t m = 0; m < c.M; ++m)
          for (int64_t n = c.N; n < ldc; ++n) EXPECT_EQ(C[m * ldc + n], cf[m * ldc + n]);
      }
}

class GemmBf16Path : public ::testing::TestWithParam<Bf16GemmPath> {
 protected:
  void SetUp() override {
    if (GetParam() == Bf16GemmPath::kMatmul && !bf16_matmul_available())
      GTEST_SKIP() << "oneDNN has no bf16 matmul for this CPU (it needs AVX-512); the sgemm path is tested";
  }
};

TEST_P(GemmBf16Path, AllTransposesStridesAlphaBeta) {
  const Bf16GemmPath path = GetParam();
  expect_matches_reference<bf16>([path](bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A,
                                        int64_t lda, const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
    gemm_bf16_via(path, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  });
}

TEST_P(GemmBf16Path, DenseLayoutsAsTheModelUsesThem) {
  // Unpadded row-major operands of model-like sizes: the layouts for which oneDNN picks its fastest
  // kernels (AMX brgemm on CPUs that have it), which the padded cases above do not reach.
  const int64_t M = 192, N = 320, K = 256;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "ta " << ta << " tb " << tb);
      const int64_t lda = ta ? M : K, ldb = tb ? K : N;
      auto af = random_vector(M * K, 11), bf = random_vector(K * N, 12);
      std::vector<bf16> A(af.size()), B(bf.size());
      convert_f32_to_bf16(af.data(), A.data(), M * K);
      convert_f32_to_bf16(bf.data(), B.data(), K * N);
      std::vector<double> ref(M * N, 0.0);
      reference(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, ref, N);
      std::vector<float> C(M * N, 1.0f);
      gemm_bf16_via(GetParam(), ta, tb, M, N, K, 1.0f, A.data(), lda, B.data(), ldb, 0.0f, C.data(), N);
      double err = 0.0, peak = 1e-30;
      for (int64_t i = 0; i < M * N; ++i) {
        err = std::max(err, std::fabs(C[i] - ref[i]));
        peak = std::max(peak, std::fabs(ref[i]));
      }
      EXPECT_LE(err / peak, 1e-5);
    }
  RecordProperty("onednn_kernel", gemm_bf16_implementation(M, N, K));
}

INSTANTIATE_TEST_SUITE_P(Paths, GemmBf16Path, ::testing::Values(Bf16GemmPath::kMatmul, Bf16GemmPath::kSgemm),
                         [](const ::testing::TestParamInfo<Bf16GemmPath>& i) {
                           return std::string(i.param == Bf16GemmPath::kMatmul ? "matmul" : "sgemm");
                         });

TEST(GemmBf16, ReportsItsImplementation) {
  // oneDNN names its bf16 kernel where it has one (AVX-512 and up); on AVX2-only CPUs it has none,
  // and the report says so instead of failing.
  const bool avx512 = hardware_isa() == Isa::kAvx512;
  EXPECT_EQ(bf16_matmul_available(), !gemm_bf16_implementation(64, 64, 64).empty());
  if (avx512) EXPECT_TRUE(bf16_matmul_available());
  if (!bf16_matmul_available()) {
    EXPECT_EQ(bf16_gemm_path(), Bf16GemmPath::kSgemm);
    EXPECT_NE(bf16_gemm_description().find("no bf16 matmul for this CPU"), std::string::npos)
        << bf16_gemm_description();
  }
}

TEST(GemmBf16, PathFollowsBf16HardwareAndSaysSo) {
  // Without GALE_BF16_GEMM the matmul is used exactly when oneDNN runs it on bf16 hardware: AMX
  // tiles or AVX512-BF16 dot products, which a CPU with the avx512bf16 flag always gets.
  ASSERT_EQ(std::getenv("GALE_BF16_GEMM"), nullptr);
  const std::string impl = gemm_bf16_implementation(1024, 3072, 768);
  const bool native = impl.find("amx") != std::string::npos || impl.find("avx512_core_bf16") != std::string::npos;
  EXPECT_EQ(bf16_matmul_native(), native) << impl;
  if (__builtin_cpu_supports("avx512bf16") && hardware_isa() == Isa::kAvx512) EXPECT_TRUE(native) << impl;
  EXPECT_EQ(bf16_gemm_path(), native ? Bf16GemmPath::kMatmul : Bf16GemmPath::kSgemm);
  const std::string d = bf16_gemm_description();
  EXPECT_NE(d.find(native ? "oneDNN bf16 matmul" : "f32 sgemm"), std::string::npos) << d;
}

TEST(GemmBf16, EnvironmentIsValidated) {
  EXPECT_TRUE(validate_bf16_gemm_environment().ok());
  setenv("GALE_BF16_GEMM", "sgemm", 1);
  EXPECT_TRUE(validate_bf16_gemm_environment().ok());
  setenv("GALE_BF16_GEMM", "matmul", 1);
  Status matmul = validate_bf16_gemm_environment();
  EXPECT_EQ(matmul.ok(), bf16_matmul_available()) << matmul.message();
  if (!matmul.ok())
    EXPECT_NE(matmul.message().find("has no bf16 matmul for this CPU"), std::string::npos) << matmul.message();
  setenv("GALE_BF16_GEMM", "amx", 1);
  Status s = validate_bf16_gemm_environment();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("GALE_BF16_GEMM: expected matmul, sgemm or auto, found 'amx'"), std::string::npos)
      << s.message();
  unsetenv("GALE_BF16_GEMM");
}

// ---- f16 (--fp16)

// Edges of the half range, every half's neighbourhood (its value, the midpoints to the next one
// and a float on either side of them), and random floats over all exponents.
std::vector<float> f16_conversion_inputs() {
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
  const std::vector<float> x = f16_conversion_inputs();
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
  expect_matches_reference<f16>([](bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const f16* A,
                                   int64_t lda, const f16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
    gemm_f16(sgemm, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  });
}

}  // namespace
}  // namespace gale
