// sgemm on oneDNN, the start-up description of the GEMM backend and the start-up check.
#include "kernels/cpu/gemm.h"

#include <link.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/check.h"
#include "core/status.h"
#include "core/threads.h"

namespace gale {

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  GALE_CHECK(st == dnnl_success) << "dnnl_sgemm failed (status " << static_cast<int>(st) << ") for M=" << M
                                 << " N=" << N << " K=" << K;
}

GemmSplit gemm_partition(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, int threads) {
  if (threads < 2 || threads > kGemmMaxSplitThreads || (trans_a && trans_b)) return GemmSplit::kLibrary;
  const auto fits = [&](int64_t n) { return n >= threads * kGemmMinPartRows; };
  if (trans_a) return M >= 4 * N && fits(M) ? GemmSplit::kRows : GemmSplit::kLibrary;  // weight gradient
  if (trans_b) return fits(N) ? GemmSplit::kCols : GemmSplit::kLibrary;                 // forward
  return K >= 2 * N && fits(M) ? GemmSplit::kRows : GemmSplit::kLibrary;                // data gradient
}

const char* gemm_split_name(GemmSplit s) {
  switch (s) {
    case GemmSplit::kRows: return "rows";
    case GemmSplit::kCols: return "cols";
    default: return "library";
  }
}

void sgemm_partitioned(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                       int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  sgemm_split(gemm_partition(trans_a, trans_b, M, N, K, num_threads()), trans_a, trans_b, M, N, K, alpha, A, lda, B,
              ldb, beta, C, ldc);
}

int64_t gemm_split_parts(int64_t extent, int threads) {
  if (threads < 2) return 1;
  const int64_t dynamic = int64_t{threads} * kGemmPartsPerThread;
  return extent / dynamic >= kGemmMinDynamicPart ? dynamic : threads;
}

void sgemm_split(GemmSplit split, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                 const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  // Inside another parallel region (a team of one here) the whole product runs on this thread.
  const int threads = num_threads();
  if (split == GemmSplit::kLibrary || threads < 2 || omp_in_parallel()) {
    return sgemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  const int64_t extent = split == GemmSplit::kRows ? M : N;
  const int64_t parts = gemm_split_parts(extent, threads);
  const int64_t part = (extent / parts + 15) / 16 * 16;
  // Dynamic: whichever thread is free takes the next part (and a runtime that starts fewer threads
  // than asked still covers every part).
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
  for (int64_t p = 0; p < parts; ++p) {
    const int64_t lo = std::min(extent, p * part);
    const int64_t hi = p == parts - 1 ? extent : std::min(extent, lo + part);
    if (hi > lo && split == GemmSplit::kRows) {
      sgemm(trans_a, trans_b, hi - lo, N, K, alpha, A + (trans_a ? lo : lo * lda), lda, B, ldb, beta, C + lo * ldc,
            ldc);
    } else if (hi > lo) {
      sgemm(trans_a, trans_b, M, hi - lo, K, alpha, A, lda, B + (trans_b ? lo * ldb : lo), ldb, beta, C + lo, ldc);
    }
  }
}

namespace {
const char* isa_name(dnnl_cpu_isa_t isa) {
  switch (isa) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "other";
  }
}
}  // namespace

std::string gemm_backend_description() {
  const dnnl_version_t* v = dnnl_version();
  return str_cat("oneDNN ", v->major, ".", v->minor, ".", v->patch, " sgemm (kernel ISA ",
                 isa_name(dnnl_get_effective_cpu_isa()), ", OpenMP runtime shared with Gale, ", num_threads(),
                 " threads)");
}

namespace {

bool has_isa_bits(dnnl_cpu_isa_t isa, dnnl_cpu_isa_t level) {
  return (static_cast<unsigned>(isa) & static_cast<unsigned>(level)) == static_cast<unsigned>(level);
}

}  // namespace

bool gemm_split_bit_exact() {
  return has_isa_bits(dnnl_get_effective_cpu_isa(), dnnl_cpu_isa_avx512_core);
}

namespace {

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// Shared libraries whose file name starts with one of these run a thread pool of their own.
constexpr const char* kForeignPoolPrefixes[] = {
    "libiomp5", "libomp.",                                                 // other OpenMP runtimes
    "libopenblas", "libblis",                                              // threaded BLAS
    "libmkl_intel_thread", "libmkl_gnu_thread", "libmkl_tbb_thread", "libtbb."};

int collect_foreign_pool(dl_phdr_info* info, size_t, void* data) {
  auto* out = static_cast<std::vector<std::string>*>(data);
  const char* path = info->dlpi_name;
  if (!path || !*path) return 0;
  const char* slash = std::strrchr(path, '/');
  std::string file = slash ? slash + 1 : path;
  for (const char* prefix : kForeignPoolPrefixes) {
    if (file.compare(0, std::strlen(prefix), prefix) == 0) {
      out->push_back(file);
      break;
    }
  }
  return 0;
}

}  // namespace

GemmEnvironment detect_gemm_environment(int local_processes) {
  GemmEnvironment env;
  __builtin_cpu_init();
  env.cpu_avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
                   __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                   __builtin_cpu_supports("avx512vl");
  env.cpu_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
  env.onednn_isa = isa_name(isa);
  env.onednn_avx512 = has_isa_bits(isa, dnnl_cpu_isa_avx512_core);
  env.onednn_avx2 = has_isa_bits(isa, dnnl_cpu_isa_avx2);
  env.onednn_max_cpu_isa_env = env_or_empty("ONEDNN_MAX_CPU_ISA");
  if (env.onednn_max_cpu_isa_env.empty()) env.onednn_max_cpu_isa_env = env_or_empty("DNNL_MAX_CPU_ISA");
  env.omp_num_threads_env = env_or_empty("OMP_NUM_THREADS");
  env.threads = num_threads();
  env.cores = available_cores();
  env.local_processes = local_processes > 0 ? local_processes : 1;
  dl_iterate_phdr(collect_foreign_pool, &env.foreign_thread_pools);
  return env;
}

std::vector<std::string> gemm_environment_warnings(const GemmEnvironment& env) {
  std::vector<std::string> out;
  std::string cause = env.onednn_max_cpu_isa_env.empty()
                          ? std::string("oneDNN did not detect it")
                          : str_cat("ONEDNN_MAX_CPU_ISA/DNNL_MAX_CPU_ISA=", env.onednn_max_cpu_isa_env,
                                    " limits it; unset that variable");
  if (env.cpu_avx512 && !env.onednn_avx512) {
    out.push_back(str_cat("GEMM: oneDNN runs ", env.onednn_isa,
                          " kernels on a CPU with AVX-512, about half the FP32 peak or less (", cause, ")"));
  } else if (env.cpu_avx2 && !env.onednn_avx2) {
    out.push_back(str_cat("GEMM: oneDNN runs ", env.onednn_isa,
                          " kernels on a CPU with AVX2 and FMA, a fraction of the FP32 peak (", cause, ")"));
  }
  int used = env.threads * env.local_processes;
  std::string threads_from =
      env.omp_num_threads_env.empty() ? std::string("") : str_cat(" (OMP_NUM_THREADS=", env.omp_num_threads_env, ")");
  if (2 * used <= env.cores) {
    out.push_back(str_cat("GEMM: ", env.local_processes, " process(es) x ", env.threads, " OpenMP thread(s)",
                          threads_from, " use ", used, " of the ", env.cores,
                          " available cores; unset OMP_NUM_THREADS or set it to cores / processes per node (",
                          env.cores / env.local_processes, ")"));
  } else if (used > env.cores) {
    out.push_back(str_cat("GEMM: ", env.local_processes, " process(es) x ", env.threads, " OpenMP thread(s)",
                          threads_from, " oversubscribe the ", env.cores,
                          " available cores and will wait on each other; set OMP_NUM_THREADS to ",
                          std::max(1, env.cores / env.local_processes)));
  }
  for (const auto& lib : env.foreign_thread_pools) {
    out.push_back(str_cat("GEMM: ", lib,
                          " is loaded in this process and runs a thread pool of its own, which competes with "
                          "Gale's OpenMP threads for the cores (check LD_PRELOAD and LD_LIBRARY_PATH)"));
  }
  return out;
}

std::vector<std::string> gemm_startup_check(int local_processes) {
  return gemm_environment_warnings(detect_gemm_environment(local_processes));
}

}  // namespace gale
