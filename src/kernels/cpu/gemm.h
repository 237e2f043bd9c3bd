// Single-precision GEMM for the whole engine, on oneDNN (chosen by measurement: bench/gemm).
//
// Row-major: C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C, where op(X) = X or X^T and
// lda/ldb/ldc are row strides of the matrices as stored. oneDNN runs on the process's OpenMP
// threads (core/threads.h), so there is exactly one thread pool.
//
// Why oneDNN: measured on the 2-core AVX-512 machine (bench/gemm): oneDNN sgemm ~250-350
// GFLOP/s out of the box; Debian OpenBLAS 0.3.21 misdetects the CPU ("Prescott", ~30 GFLOP/s
// per core) unless OPENBLAS_CORETYPE is set, and runs its own pthread pool; BLIS 0.9 picks its
// haswell kernels (~125). oneDNN detects the ISA itself and shares libgomp with Gale.
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace gale {

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// "oneDNN 2.6.3 sgemm, ISA avx512_core_amx, OpenMP runtime, 2 threads" for the start-up banner.
std::string gemm_backend_description();

// ---- bf16 (kernels/cpu/gemm_bf16.cc, bf16_convert*.cc)

// C[M,N] = alpha·op(A)·op(B) + beta·C with bf16 A and B and f32 C, accumulated in f32 — the same
// conventions as sgemm. Runs oneDNN's matmul primitive, created once per (shape, strides, alpha,
// beta) and cached, on the same OpenMP threads. Whether it beats sgemm depends on the CPU (AMX or
// AVX512-BF16); docs/kernels.md has the measurements on the development machine.
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda,
               const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc);

// oneDNN's implementation name for a bf16 matmul of this shape (e.g. "brg:avx512_core_amx"),
// to say in reports whether AMX is used.
std::string gemm_bf16_implementation(int64_t M, int64_t N, int64_t K);

// f32 -> bf16 with round-to-nearest-even, NaN kept NaN (quiet), bit-identical to float_to_bf16
// (core/dtype.h), and bf16 -> f32 (exact). Vectorised, dispatched on detected_isa().
void convert_f32_to_bf16(const float* x, bf16* y, int64_t n);
void convert_bf16_to_f32(const bf16* x, float* y, int64_t n);

}  // namespace gale
