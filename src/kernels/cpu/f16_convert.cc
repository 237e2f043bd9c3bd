// f32 <-> f16 conversion and the f16 GEMM: baseline kernels and the ISA dispatch.
#include "kernels/cpu/f16_convert.h"

#include "core/check.h"
#include "core/tensor.h"
#include "core/threads.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa.h"

namespace gale {

namespace {
constexpr int64_t kGrain = 1 << 16;

// The stored [rows, cols] f16 matrix (row stride ld) as a packed f32 tensor.
Tensor widen(const f16* x, int64_t rows, int64_t cols, int64_t ld) {
  Tensor out = Tensor::empty({rows, cols});
  float* o = out.data<float>();
  if (ld == cols) {
    convert_f16_to_f32(x, o, rows * cols);
  } else {
    for (int64_t r = 0; r < rows; ++r) convert_f16_to_f32(x + r * ld, o + r * cols, cols);
  }
  return out;
}
}  // namespace

void convert_f32_to_f16_scalar(const float* x, f16* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = float_to_f16(x[i]);
}

void convert_f16_to_f32_scalar(const f16* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = f16_to_float(x[i]);
}

void convert_f32_to_f16(const float* x, f16* y, int64_t n) {
  auto fn = detected_isa() >= Isa::kAvx2 ? convert_f32_to_f16_avx2 : convert_f32_to_f16_scalar;
  parallel_for(n, kGrain, [&](int64_t b, int64_t e) { fn(x + b, y + b, e - b); });
}

void convert_f16_to_f32(const f16* x, float* y, int64_t n) {
  auto fn = detected_isa() >= Isa::kAvx2 ? convert_f16_to_f32_avx2 : convert_f16_to_f32_scalar;
  parallel_for(n, kGrain, [&](int64_t b, int64_t e) { fn(x + b, y + b, e - b); });
}

void gemm_f16(SgemmFn gemm, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const f16* A,
              int64_t lda, const f16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  GALE_CHECK(K > 0) << "gemm_f16 with K = 0";
  // Stored shapes: A is [M, K] (or [K, M] when transposed), B is [K, N] (or [N, K]).
  Tensor a = trans_a ? widen(A, K, M, lda) : widen(A, M, K, lda);
  Tensor b = trans_b ? widen(B, N, K, ldb) : widen(B, K, N, ldb);
  gemm(trans_a, trans_b, M, N, K, alpha, a.data<float>(), a.size(1), b.data<float>(), b.size(1), beta, C, ldc);
}

}  // namespace gale
