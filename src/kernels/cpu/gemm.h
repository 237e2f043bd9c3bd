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
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace gale {

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

using SgemmFn = decltype(&sgemm);

// The same product with the threads partitioned by Gale instead of by the library: the output is
// cut into blocks of whole rows (or columns), one per OpenMP thread (or a few, gemm_split_parts),
// and each thread runs oneDNN's single-threaded sgemm on its blocks (inside a parallel region
// oneDNN runs on the calling thread).
// Level 1's `partitioned-gemm` feature installs it as OpTable::gemm; level 0 keeps sgemm.
//
// Why: with 2 threads oneDNN's own partition leaves a lot on the table for some shapes of a
// training step (bench/gemm_bench, `split` rows; docs/gemm.md): the fc2 forward (1024×768×3072)
// runs at 255-275 GFLOP/s threaded against 315-330 split by columns, the LM-head chunks
// (256×50304×768) at 227-240 against 246-266, the fc1 weight gradient at 305 against 322-339.
// The rule (gemm_partition) splits only where that measured faster and leaves the library's
// partition elsewhere, e.g. the QKV weight gradient (2304×768×1024: 283-296 threaded, 238-250
// split). Splitting by whole rows or columns never changes the order of the K-sum inside an
// element, so with oneDNN's AVX-512 kernels a split call equals the single-threaded sgemm bit for
// bit; it can differ from the library's threaded call in the last bits (which may split K), within
// the GEMM tests' tolerance. oneDNN's AVX2 kernel (AMD Zen 3) picks its blocking from the product's
// size, so there a part's sums can differ from the uncut product's in the last bits too: no cut
// offset (multiples of 16, 24, 48 or 96) kept every shape identical (gemm_split_bit_exact()).
void sgemm_partitioned(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                       int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// How sgemm_partitioned cuts a product over `threads` threads:
//   kLibrary: one sgemm call on all threads (1 thread, small or TT products, shapes where split lost);
//   kRows:    M split (A op Aᵀ rows), e.g. the weight gradient dW[out, in] += dYᵀ·X when out ≥ 4·in
//             and the data gradient dX = dY·W when its K ≥ 2·N;
//   kCols:    N split, the forward Y = X·Wᵀ (B transposed, not A).
// Parts are balanced, multiples of 16 except the last, and at least kGemmMinPartRows each. The rule
// was measured with 2 threads; above kGemmMaxSplitThreads the library's 2-D partition is kept
// (one-dimensional parts get thin there, and it is not measured).
enum class GemmSplit { kLibrary, kRows, kCols };
constexpr int64_t kGemmMinPartRows = 128;
constexpr int kGemmMaxSplitThreads = 4;
GemmSplit gemm_partition(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, int threads);

// How many parts a split cuts `extent` rows or columns into: one per thread, or
// kGemmPartsPerThread per thread when each part still has kGemmMinDynamicPart rows or more. The
// parts go to the threads first come, first served, so a thread on a slower core takes fewer:
// inside a GPT-2-small step one of this VM's two cores ran the 190 ms LM-head forward 15-25% slower
// than the other (which one changed between runs) while the other idled 30-45 ms at the barrier.
// Only the LM-head products (50304 rows or columns) have parts that large; the layers' products
// keep one part per thread, where a quarter would run the library on thin blocks.
constexpr int64_t kGemmPartsPerThread = 4;
constexpr int64_t kGemmMinDynamicPart = 2048;
int64_t gemm_split_parts(int64_t extent, int threads);
// sgemm with a given split over num_threads() threads (sgemm_partitioned passes gemm_partition's
// choice; bench/gemm_split_bench times each split).
void sgemm_split(GemmSplit split, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                 const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
const char* gemm_split_name(GemmSplit s);  // "library", "rows", "cols"
// True where a row or column split is bit-identical to one thread (oneDNN's kernel is AVX-512).
bool gemm_split_bit_exact();

// "oneDNN 2.6.3 sgemm, ISA avx512_core_amx, OpenMP runtime, 2 threads" for the start-up banner.
std::string gemm_backend_description();

// What the GEMM start-up check looks at. `detect_gemm_environment` fills it from this process;
// tests build it by hand.
struct GemmEnvironment {
  // CPU and OS together support the ISA (CPUID bits and the XSAVE state enabled by the kernel);
  // AVX-512 means oneDNN's avx512_core subset: F, CD, BW, DQ and VL.
  bool cpu_avx512 = false;
  bool cpu_avx2 = false;
  // The ISA oneDNN dispatches to (dnnl_get_effective_cpu_isa), as a name and as levels.
  std::string onednn_isa = "unknown";
  bool onednn_avx512 = false;
  bool onednn_avx2 = false;
  // Environment variables that change it ("" when unset).
  std::string onednn_max_cpu_isa_env;  // ONEDNN_MAX_CPU_ISA, else DNNL_MAX_CPU_ISA
  std::string omp_num_threads_env;     // OMP_NUM_THREADS
  int threads = 1;                     // OpenMP threads of this process (num_threads())
  int cores = 1;                       // CPUs this process may run on (its affinity mask)
  int local_processes = 1;             // Gale processes sharing these cores (ranks per node)
  // Loaded shared libraries that bring a second thread pool (another OpenMP runtime or a
  // threaded BLAS), by file name: "libiomp5.so", "libopenblas.so.0", ...
  std::vector<std::string> foreign_thread_pools;
};

// Looks at this process. `local_processes`: Gale processes on this node (ranks per node), each
// expected to use cores / local_processes threads.
GemmEnvironment detect_gemm_environment(int local_processes = 1);

// One line per problem that would make GEMMs (and so training) much slower than this machine
// allows, each naming the cause and the fix; empty when all is well. The caller prints them.
// Reported: oneDNN running below AVX-512 (or AVX2) on a CPU that has it, with the variable that
// caused it; fewer than half of the cores in use (OMP_NUM_THREADS=1 on a many-core machine);
// more threads than cores (oversubscription); a second thread pool loaded in the process.
std::vector<std::string> gemm_environment_warnings(const GemmEnvironment& env);

// gemm_environment_warnings(detect_gemm_environment(local_processes)): call once at start-up and
// print each line as a warning (rank 0 is enough).
std::vector<std::string> gemm_startup_check(int local_processes = 1);

// ---- bf16 (kernels/cpu/gemm_bf16.cc, bf16_convert*.cc)

// C[M,N] = alpha·op(A)·op(B) + beta·C with bf16 A and B and f32 C, accumulated in f32 — the same
// conventions as sgemm. Runs oneDNN's matmul primitive, created once per (shape, strides, alpha,
// beta) and cached, on the same OpenMP threads. Whether it beats sgemm depends on the CPU (AMX or
// AVX512-BF16); docs/kernels.md has the measurements on the development machine.
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda,
               const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc);

using Bf16GemmFn = decltype(&gemm_bf16);

// oneDNN's implementation name for a bf16 matmul of this shape (e.g. "brg:avx512_core_amx"),
// to say in reports whether AMX is used; "" where oneDNN has no bf16 matmul for this CPU
// (oneDNN 2.6 needs AVX-512 for it: on AVX2-only CPUs such as AMD Zen 3 creating one fails).
std::string gemm_bf16_implementation(int64_t M, int64_t N, int64_t K);
// gemm_bf16_implementation(...) is not empty: the kMatmul path below can run here.
bool bf16_matmul_available();

// oneDNN runs its bf16 matmul on bf16 hardware: AMX tiles ("amx" in the kernel's name) or
// AVX512-BF16 dot products ("avx512_core_bf16", e.g. AMD Zen 4, Intel Cooper Lake). Without either
// it widens to f32 inside its kernel (AVX-512 CPUs such as Skylake or Ice Lake servers).
bool bf16_matmul_native();

// How gemm_bf16 computes. kMatmul: oneDNN's bf16 matmul. kSgemm: both inputs widened to f32
// (exact) and multiplied by sgemm — the same products, accumulated in f32 in another order. The
// matmul is chosen where it runs natively (bf16_matmul_native): AMX measured 2-7x the sgemm rate
// and AVX512-BF16 (Zen 4) 1.5-2x, while without either oneDNN's bf16 matmul measured about half
// the sgemm rate, so --bf16 then keeps its memory saving (bf16 weights copy and activations) and
// fp32 GEMM speed.
// GALE_BF16_GEMM=matmul|sgemm|auto forces the choice (tests, benchmarks); matmul where oneDNN has
// no bf16 matmul for the CPU is a start-up error (validate_bf16_gemm_environment).
enum class Bf16GemmPath { kMatmul, kSgemm };
Bf16GemmPath bf16_gemm_path();
// gemm_bf16 on a given path (gemm_bf16 itself uses bf16_gemm_path()); for tests and benchmarks.
void gemm_bf16_via(Bf16GemmPath path, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                   const bf16* A, int64_t lda, const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc);
// "oneDNN bf16 matmul (brg:avx512_core_amx_bf16, AMX)" or "f32 sgemm on widened inputs (...why)".
std::string bf16_gemm_description();
// A GALE_BF16_GEMM value that names no path, or matmul where it cannot run: call at start-up for a
// clear error.
Status validate_bf16_gemm_environment();

// f32 -> bf16 with round-to-nearest-even, NaN kept NaN (quiet), bit-identical to float_to_bf16
// (core/dtype.h), and bf16 -> f32 (exact). Vectorised, dispatched on detected_isa().
void convert_f32_to_bf16(const float* x, bf16* y, int64_t n);
void convert_bf16_to_f32(const bf16* x, float* y, int64_t n);

// ---- f16 (kernels/cpu/f16_convert*.cc), for --fp16

// C[M,N] = alpha·op(A)·op(B) + beta·C with f16 A and B and f32 C, accumulated in f32 (what fp16
// tensor cores compute). oneDNN 2.6 has no f16 matmul for CPUs without AVX512-FP16, so both inputs
// are widened to f32 (exact) and multiplied by `gemm`: the product of two halves is exact in f32,
// so this is an f16 GEMM with f32 accumulation, at the f32 GEMM's speed.
void gemm_f16(SgemmFn gemm, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const f16* A,
              int64_t lda, const f16* B, int64_t ldb, float beta, float* C, int64_t ldc);

// f32 -> f16 with round-to-nearest-even (overflow to infinity, NaN kept NaN), bit-identical to
// float_to_f16 (core/dtype.h), and f16 -> f32 (exact). F16C where detected_isa() >= kAvx2.
void convert_f32_to_f16(const float* x, f16* y, int64_t n);
void convert_f16_to_f32(const f16* x, float* y, int64_t n);

}  // namespace gale
