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

}  // namespace gale
