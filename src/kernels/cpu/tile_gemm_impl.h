// Register-blocked GEMM on small cache-resident tiles (templates over a simd type V), for the
// flash-attention tile products.
//
//   C[m, 0:N] (+)= Σ_k A(m, k) · B[k, 0:N]    for m < M, k < K, N = nv·W (whole vectors)
// with A(m, k) = a[m·a_rs + k·a_cs] (so Aᵀ is just other strides), B and C row-major. Blocks of
// MR rows × NR vectors stay in registers for the whole K loop; MR is chosen from the register
// count so accumulators + B vectors + one broadcast fit.
#pragma once

#include <cstdint>

#include "kernels/cpu/fused_common_impl.h"

namespace gale::fused {

struct TileOperandA {
  const float* a;
  int64_t row_stride, col_stride;
};

template <class V>
constexpr int max_nr() {
  return V::kRegisters >= 32 ? 6 : (V::W == 1 ? 4 : 3);
}

template <class V, int NR>
constexpr int mr_for() {
  const int m = (V::kRegisters - NR - 2) / NR;
  return m > 8 ? 8 : (m < 1 ? 1 : m);
}

template <class V, int MR, int NR>
void tile_micro(int64_t K, TileOperandA A, const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  using F = typename V::F;
  F acc[MR][NR];
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 8
    for (int n = 0; n < NR; ++n) acc[m][n] = accumulate ? V::load(c + m * ldc + n * V::W) : V::zero();
  const float* a = A.a;
  for (int64_t k = 0; k < K; ++k) {
    F bv[NR];
#pragma GCC unroll 8
    for (int n = 0; n < NR; ++n) bv[n] = V::load(b + k * ldb + n * V::W);
    const float* ak = a + k * A.col_stride;
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      const F av = V::set1(ak[m * A.row_stride]);
#pragma GCC unroll 8
      for (int n = 0; n < NR; ++n) acc[m][n] = V::fmadd(av, bv[n], acc[m][n]);
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 8
    for (int n = 0; n < NR; ++n) V::store(c + m * ldc + n * V::W, acc[m][n]);
}

// A leftover block of `rows` < MR rows.
template <class V, int NR, int MR>
void tile_micro_rows(int64_t rows, int64_t K, TileOperandA A, const float* b, int64_t ldb, float* c, int64_t ldc,
                     bool accumulate) {
  if constexpr (MR > 0) {
    if (rows == MR)
      tile_micro<V, MR, NR>(K, A, b, ldb, c, ldc, accumulate);
    else
      tile_micro_rows<V, NR, MR - 1>(rows, K, A, b, ldb, c, ldc, accumulate);
  }
}

template <class V, int NR>
void tile_gemm_columns(int64_t M, int64_t K, TileOperandA A, const float* b, int64_t ldb, float* c, int64_t ldc,
                       bool accumulate) {
  constexpr int MR = mr_for<V, NR>();
  int64_t m = 0;
  for (; m + MR <= M; m += MR)
    tile_micro<V, MR, NR>(K, TileOperandA{A.a + m * A.row_stride, A.row_stride, A.col_stride}, b, ldb, c + m * ldc, ldc,
                          accumulate);
  if (m < M)
    tile_micro_rows<V, NR, MR - 1>(M - m, K, TileOperandA{A.a + m * A.row_stride, A.row_stride, A.col_stride}, b, ldb,
                                   c + m * ldc, ldc, accumulate);
}

// C[M, nv·W] (+)= A[M, K] · B[K, nv·W]; column groups of at most max_nr<V>() vectors, as equal as
// possible.
template <class V>
void tile_gemm(int64_t M, int64_t nv, int64_t K, TileOperandA A, const float* b, int64_t ldb, float* c, int64_t ldc,
               bool accumulate) {
  if (M <= 0 || nv <= 0) return;
  if (K <= 0) {
    if (!accumulate)
      for (int64_t m = 0; m < M; ++m)
        for (int64_t j = 0; j < nv * V::W; ++j) c[m * ldc + j] = 0.0f;
    return;
  }
  constexpr int kMaxNr = max_nr<V>();
  const int64_t groups = (nv + kMaxNr - 1) / kMaxNr;
  int64_t col = 0;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t nr = nv * (g + 1) / groups - nv * g / groups;
    const float* bg = b + col * V::W;
    float* cg = c + col * V::W;
    switch (nr) {
      case 1: tile_gemm_columns<V, 1>(M, K, A, bg, ldb, cg, ldc, accumulate); break;
      case 2: tile_gemm_columns<V, 2>(M, K, A, bg, ldb, cg, ldc, accumulate); break;
      case 3: tile_gemm_columns<V, 3>(M, K, A, bg, ldb, cg, ldc, accumulate); break;
      default:
        if constexpr (kMaxNr >= 4) {
          if (nr == 4) tile_gemm_columns<V, 4>(M, K, A, bg, ldb, cg, ldc, accumulate);
        }
        if constexpr (kMaxNr >= 5) {
          if (nr == 5) tile_gemm_columns<V, 5>(M, K, A, bg, ldb, cg, ldc, accumulate);
        }
        if constexpr (kMaxNr >= 6) {
          if (nr == 6) tile_gemm_columns<V, 6>(M, K, A, bg, ldb, cg, ldc, accumulate);
        }
        break;
    }
    col += nr;
  }
}

}  // namespace gale::fused
