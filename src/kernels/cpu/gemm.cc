// sgemm on oneDNN and the start-up description of the GEMM backend.
#include "kernels/cpu/gemm.h"

#include <oneapi/dnnl/dnnl.h>

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

}  // namespace gale
