// sgemm_partitioned against a double-precision product and against one-threaded sgemm (bit for bit
// with oneDNN's AVX-512 kernels, gemm_split_bit_exact; in the last bits elsewhere), for every transpose combination, odd sizes, beta 0 and 1, and 1 to 3 threads; and its split rule.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <vector>

#include "core/status.h"
#include "core/threads.h"
#include "kernels/cpu/gemm.h"
#include "testing.h"

namespace gale {
namespace {

using testing::random_vector;

struct Case {
  bool ta, tb;
  int64_t M, N, K;
  float beta;
};

// C = alpha·op(A)·op(B) + beta·C in double, row-major with the given strides.
std::vector<float> product_f64(const Case& c, float alpha, const std::vector<float>& A, int64_t lda,
                               const std::vector<float>& B, int64_t ldb, std::vector<float> C, int64_t ldc) {
  for (int64_t i = 0; i < c.M; ++i)
    for (int64_t j = 0; j < c.N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < c.K; ++k)
        s += static_cast<double>(c.ta ? A[k * lda + i] : A[i * lda + k]) * (c.tb ? B[j * ldb + k] : B[k * ldb + j]);
      C[i * ldc + j] = static_cast<float>(alpha * s + c.beta * C[i * ldc + j]);
    }
  return C;
}

// A split product against the one-threaded one: identical where gemm_split_bit_exact(), else equal
// up to a reordered K-sum (a tenth of the tolerance against double precision).
void expect_split_matches(const std::vector<float>& got, const std::vector<float>& one, int64_t K,
                          const std::string& what) {
  ASSERT_EQ(got.size(), one.size()) << what;
  if (gemm_split_bit_exact()) {
    EXPECT_EQ(got, one) << what;
    return;
  }
  const double tol = 1e-5 * (1 + std::sqrt(static_cast<double>(K)));
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], one[i], tol) << what << " at " << i;
}

class ThreadCount {
 public:
  explicit ThreadCount(int n) : saved_(num_threads()) { set_num_threads(n); }
  ~ThreadCount() { set_num_threads(saved_); }

 private:
  int saved_;
};

TEST(SgemmPartitioned, MatchesDoubleAndSingleThreadedSgemm) {
  const std::vector<Case> cases = {
      {false, true, 37, 613, 29, 0.0f},   {false, true, 300, 1029, 77, 1.0f},  // forward: columns split
      {false, false, 611, 33, 301, 0.0f}, {false, false, 517, 40, 90, 1.0f},   // data gradient: rows split
      {true, false, 1200, 70, 33, 1.0f},  {true, false, 90, 80, 70, 0.0f},     // weight gradient
      {true, true, 300, 300, 20, 1.0f},   {false, true, 5, 7, 3, 0.0f},        // library
  };
  for (const Case& c : cases) {
    // Leading dimensions larger than the matrices, as for a slice of a wider buffer.
    const int64_t lda = (c.ta ? c.M : c.K) + 3, ldb = (c.tb ? c.K : c.N) + 5, ldc = c.N + 2;
    const auto A = random_vector((c.ta ? c.K : c.M) * lda, 11);
    const auto B = random_vector((c.tb ? c.N : c.K) * ldb, 12);
    const auto C0 = random_vector(c.M * ldc, 13);
    const float alpha = 0.75f;
    const auto want = product_f64(c, alpha, A, lda, B, ldb, C0, ldc);
    std::vector<float> one = C0;
    {
      ThreadCount t(1);
      sgemm(c.ta, c.tb, c.M, c.N, c.K, alpha, A.data(), lda, B.data(), ldb, c.beta, one.data(), ldc);
    }
    for (int threads : {1, 2, 3}) {
      ThreadCount t(threads);
      std::vector<float> got = C0;
      sgemm_partitioned(c.ta, c.tb, c.M, c.N, c.K, alpha, A.data(), lda, B.data(), ldb, c.beta, got.data(), ldc);
      // Split calls sum each element as one thread does (bit for bit on AVX-512); the library's own threads may not.
      const bool split = gemm_partition(c.ta, c.tb, c.M, c.N, c.K, threads) != GemmSplit::kLibrary;
      for (int64_t i = 0; i < c.M * ldc; ++i) {
        ASSERT_NEAR(got[i], want[i], 1e-4 * (1 + std::sqrt(static_cast<double>(c.K))))
            << "M=" << c.M << " N=" << c.N << " K=" << c.K << " ta=" << c.ta << " tb=" << c.tb << " threads="
            << threads << " at " << i;
      }
      if (threads == 1) EXPECT_EQ(got, one);
      if (split) {
        expect_split_matches(got, one, c.K,
                             str_cat("M=", c.M, " N=", c.N, " K=", c.K, " ta=", c.ta, " tb=", c.tb, " threads=", threads));
      }
    }
  }
}

TEST(SgemmPartitioned, EveryForcedSplitEqualsOneThread) {
  const Case c{false, false, 301, 275, 64, 1.0f};
  const auto A = random_vector(c.M * c.K, 21), B = random_vector(c.K * c.N, 22), C0 = random_vector(c.M * c.N, 23);
  std::vector<float> one = C0;
  {
    ThreadCount t(1);
    sgemm(false, false, c.M, c.N, c.K, 1.0f, A.data(), c.K, B.data(), c.N, c.beta, one.data(), c.N);
  }
  ThreadCount t(3);
  for (GemmSplit split : {GemmSplit::kRows, GemmSplit::kCols}) {
    std::vector<float> got = C0;
    sgemm_split(split, false, false, c.M, c.N, c.K, 1.0f, A.data(), c.K, B.data(), c.N, c.beta, got.data(), c.N);
    expect_split_matches(got, one, c.K, gemm_split_name(split));
  }
}

TEST(SgemmPartitioned, DynamicPartsEqualOneThread) {
  // Extents with kGemmPartsPerThread parts per thread (and a ragged last part): rows of a weight
  // gradient and columns of a forward, as the LM head's products, kept small in the other sizes.
  for (int threads : {2, 3}) {
    const int64_t extent = int64_t{threads} * kGemmPartsPerThread * kGemmMinDynamicPart + 37;
    ASSERT_EQ(gemm_split_parts(extent, threads), threads * kGemmPartsPerThread);
    const std::vector<Case> cases = {{true, false, extent, 24, 9, 1.0f}, {false, true, 5, extent, 24, 0.0f}};
    for (const Case& c : cases) {
      const int64_t lda = c.ta ? c.M : c.K, ldb = c.tb ? c.K : c.N;
      const auto A = random_vector((c.ta ? c.K : c.M) * lda, 41), B = random_vector((c.tb ? c.N : c.K) * ldb, 42);
      const auto C0 = random_vector(c.M * c.N, 43);
      std::vector<float> one = C0;
      {
        ThreadCount t(1);
        sgemm(c.ta, c.tb, c.M, c.N, c.K, 1.0f, A.data(), lda, B.data(), ldb, c.beta, one.data(), c.N);
      }
      ThreadCount t(threads);
      std::vector<float> got = C0;
      sgemm_split(c.ta ? GemmSplit::kRows : GemmSplit::kCols, c.ta, c.tb, c.M, c.N, c.K, 1.0f, A.data(), lda, B.data(),
                  ldb, c.beta, got.data(), c.N);
      expect_split_matches(got, one, c.K, str_cat("threads=", threads, " ta=", c.ta));
    }
  }
}

TEST(SgemmPartitioned, InsideAParallelRegionComputesEverything) {
  const Case c{false, true, 64, 700, 32, 0.0f};
  const auto A = random_vector(c.M * c.K, 31), B = random_vector(c.N * c.K, 32);
  std::vector<float> want(c.M * c.N), got(c.M * c.N, -1.0f);
  sgemm(false, true, c.M, c.N, c.K, 1.0f, A.data(), c.K, B.data(), c.K, 0.0f, want.data(), c.N);
  ThreadCount t(2);
  // A caller already inside a parallel region (nested parallelism off, so a nested team has one
  // thread): no part may be skipped.
#pragma omp parallel num_threads(2)
  {
    if (omp_get_thread_num() == 0) {
      sgemm_split(GemmSplit::kCols, false, true, c.M, c.N, c.K, 1.0f, A.data(), c.K, B.data(), c.K, 0.0f, got.data(),
                  c.N);
    }
  }
  for (int64_t i = 0; i < c.M * c.N; ++i) ASSERT_NEAR(got[i], want[i], 1e-4) << i;
}

TEST(SgemmPartitioned, SplitRule) {
  // The GPT-2-small shapes of docs/gemm.md on 2 threads.
  EXPECT_EQ(gemm_partition(false, true, 1024, 768, 3072, 2), GemmSplit::kCols);     // fc2 forward
  EXPECT_EQ(gemm_partition(false, true, 256, 50304, 768, 2), GemmSplit::kCols);     // LM-head chunk
  EXPECT_EQ(gemm_partition(true, false, 3072, 768, 1024, 2), GemmSplit::kRows);     // fc1 weight gradient
  EXPECT_EQ(gemm_partition(true, false, 2304, 768, 1024, 2), GemmSplit::kLibrary);  // QKV weight gradient
  EXPECT_EQ(gemm_partition(false, false, 1024, 768, 3072, 2), GemmSplit::kRows);    // fc1 data gradient
  EXPECT_EQ(gemm_partition(false, false, 1024, 3072, 768, 2), GemmSplit::kLibrary); // fc2 data gradient
  EXPECT_EQ(gemm_partition(false, true, 1024, 768, 3072, 1), GemmSplit::kLibrary);  // one thread
  EXPECT_EQ(gemm_partition(false, true, 4096, 8192, 4096, 8), GemmSplit::kLibrary);  // many threads: 2-D
  EXPECT_EQ(gemm_partition(false, true, 1024, 200, 3072, 2), GemmSplit::kLibrary);  // parts under 128
  EXPECT_EQ(gemm_partition(true, true, 4096, 4096, 4096, 2), GemmSplit::kLibrary);
  EXPECT_STREQ(gemm_split_name(GemmSplit::kCols), "cols");
  // Parts: one per thread for the layers' products, four per thread for the LM head's.
  EXPECT_EQ(gemm_split_parts(3072, 2), 2);
  EXPECT_EQ(gemm_split_parts(16383, 2), 2);
  EXPECT_EQ(gemm_split_parts(16384, 2), 8);
  EXPECT_EQ(gemm_split_parts(50304, 2), 8);
  EXPECT_EQ(gemm_split_parts(50304, 4), 16);
  EXPECT_EQ(gemm_split_parts(20000, 4), 4);  // 1250 per part at 16 parts: under the minimum
  EXPECT_EQ(gemm_split_parts(50304, 1), 1);
}

}  // namespace
}  // namespace gale
