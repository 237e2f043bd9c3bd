// bf16 GEMM: oneDNN's matmul primitive (cached by shape) where it runs on bf16 hardware, else f32 sgemm.
#include <oneapi/dnnl/dnnl.hpp>

#include <cstdlib>
#include <oneapi/dnnl/dnnl.h>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

#include "core/check.h"
#include "core/tensor.h"
#include "kernels/cpu/gemm.h"

namespace gale {

namespace {

using dnnl::memory;

struct MatmulKey {
  bool ta, tb;
  int64_t M, N, K, lda, ldb, ldc;
  float alpha, beta;
  bool operator<(const MatmulKey& o) const {
    return std::tie(ta, tb, M, N, K, lda, ldb, ldc, alpha, beta) <
           std::tie(o.ta, o.tb, o.M, o.N, o.K, o.lda, o.ldb, o.ldc, o.alpha, o.beta);
  }
};

struct Matmul {
  dnnl::matmul primitive;
  memory::desc a, b, c;
  std::string impl;
};

class MatmulCache {
 public:
  MatmulCache() : engine_(dnnl::engine::kind::cpu, 0) {}

  const Matmul& get(const MatmulKey& k) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cache_.find(k);
    if (it != cache_.end()) return it->second;
    // Logical A [M, K], B [K, N], C [M, N]; a transposed operand is the stored matrix with swapped strides.
    memory::desc a({k.M, k.K}, memory::data_type::bf16, k.ta ? memory::dims{1, k.lda} : memory::dims{k.lda, 1});
    memory::desc b({k.K, k.N}, memory::data_type::bf16, k.tb ? memory::dims{1, k.ldb} : memory::dims{k.ldb, 1});
    memory::desc c({k.M, k.N}, memory::data_type::f32, memory::dims{k.ldc, 1});
    dnnl::primitive_attr attr;
    if (k.alpha != 1.0f) attr.set_output_scales(0, {k.alpha});
    if (k.beta != 0.0f) {
      dnnl::post_ops ops;
      ops.append_sum(k.beta);
      attr.set_post_ops(ops);
    }
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, engine_);
    Matmul m{dnnl::matmul(pd), a, b, c, pd.impl_info_str()};
    return cache_.emplace(k, std::move(m)).first->second;
  }

  // oneDNN's kernel name for a bf16 matmul of this shape, or "" with `why` set where oneDNN has none
  // for this CPU (oneDNN 2.6 needs AVX-512 for bf16 matmul; on an AVX2-only CPU creating it throws).
  std::string probe(const MatmulKey& k, std::string* why) {
    try {
      return get(k).impl;
    } catch (const dnnl::error& e) {
      *why = e.what();
      return "";
    }
  }

  const dnnl::engine& engine() const { return engine_; }

 private:
  dnnl::engine engine_;
  std::mutex mu_;
  std::map<MatmulKey, Matmul> cache_;
};

MatmulCache& cache() {
  static MatmulCache* c = new MatmulCache();  // never destroyed: may be used until exit
  return *c;
}

// The probe shape is the GPT-2-small fc1 GEMM; oneDNN picks its kernel by ISA, not by shape.
MatmulKey probe_key() { return MatmulKey{false, true, 1024, 3072, 768, 768, 768, 3072, 1.0f, 0.0f}; }

StatusOr<Bf16GemmPath> parse_path_env() {
  const char* env = std::getenv("GALE_BF16_GEMM");
  if (env == nullptr || *env == '\0' || std::strcmp(env, "auto") == 0) {
    return bf16_matmul_native() ? Bf16GemmPath::kMatmul : Bf16GemmPath::kSgemm;
  }
  if (std::strcmp(env, "matmul") == 0) {
    std::string why;
    if (cache().probe(probe_key(), &why).empty())
      return FailedPrecondition("GALE_BF16_GEMM=matmul: oneDNN ", dnnl_version()->major, ".", dnnl_version()->minor,
                                " has no bf16 matmul for this CPU (it needs AVX-512; oneDNN said: ", why,
                                "); use GALE_BF16_GEMM=sgemm or auto");
    return Bf16GemmPath::kMatmul;
  }
  if (std::strcmp(env, "sgemm") == 0) return Bf16GemmPath::kSgemm;
  return InvalidArgument("GALE_BF16_GEMM: expected matmul, sgemm or auto, found '", env, "'");
}

// The stored matrix (rows x cols, row stride ld) widened to a contiguous f32 tensor.
Tensor widen(const bf16* x, int64_t rows, int64_t cols, int64_t ld) {
  Tensor out = Tensor::empty({rows, cols});
  float* y = out.data<float>();
  for (int64_t r = 0; r < rows; ++r) convert_bf16_to_f32(x + r * ld, y + r * cols, cols);
  return out;
}

}  // namespace

Bf16GemmPath bf16_gemm_path() {
  static const Bf16GemmPath path = [] {
    StatusOr<Bf16GemmPath> p = parse_path_env();
    GALE_CHECK(p.ok()) << p.status().message();
    return p.value();
  }();
  return path;
}

std::string bf16_gemm_description() {
  const std::string impl = gemm_bf16_implementation(1024, 3072, 768);
  if (bf16_gemm_path() == Bf16GemmPath::kMatmul) return "oneDNN bf16 matmul (" + impl + ")";
  if (!bf16_matmul_available())
    return "f32 sgemm on bf16 inputs widened to f32 (oneDNN has no bf16 matmul for this CPU: it needs AVX-512)";
  return "f32 sgemm on bf16 inputs widened to f32 (oneDNN's bf16 matmul here is " + impl +
         ", without AMX or AVX512-BF16 slower than sgemm; GALE_BF16_GEMM=matmul forces it)";
}

bool bf16_matmul_available() { return !gemm_bf16_implementation(1024, 3072, 768).empty(); }

bool bf16_matmul_native() {
  const std::string impl = gemm_bf16_implementation(1024, 3072, 768);
  return impl.find("amx") != std::string::npos || impl.find("avx512_core_bf16") != std::string::npos;
}

Status validate_bf16_gemm_environment() {
  const char* env = std::getenv("GALE_BF16_GEMM");
  if (env == nullptr || *env == '\0' || std::strcmp(env, "auto") == 0) return Status::Ok();  // no probe needed
  return parse_path_env().status();
}

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda,
               const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  gemm_bf16_via(bf16_gemm_path(), trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm_bf16_via(Bf16GemmPath path, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                   const bf16* A, int64_t lda, const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  GALE_CHECK(K > 0) << "gemm_bf16 with K = 0";
  if (path == Bf16GemmPath::kSgemm) {
    // Stored shapes: A is [M, K] (or [K, M] when transposed), B is [K, N] (or [N, K]).
    Tensor a = trans_a ? widen(A, K, M, lda) : widen(A, M, K, lda);
    Tensor b = trans_b ? widen(B, N, K, ldb) : widen(B, K, N, ldb);
    sgemm(trans_a, trans_b, M, N, K, alpha, a.data<float>(), a.size(1), b.data<float>(), b.size(1), beta, C, ldc);
    return;
  }
  GALE_CHECK(bf16_matmul_available()) << "gemm_bf16 on the matmul path: oneDNN has no bf16 matmul for this CPU "
                                          "(it needs AVX-512); bf16_gemm_path() never picks it here";
  const Matmul& m = cache().get(MatmulKey{trans_a, trans_b, M, N, K, lda, ldb, ldc, alpha, beta});
  const dnnl::engine& eng = cache().engine();
  dnnl::stream stream(eng);
  memory a(m.a, eng, const_cast<bf16*>(A)), b(m.b, eng, const_cast<bf16*>(B)), c(m.c, eng, C);
  m.primitive.execute(stream, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
  stream.wait();
}

std::string gemm_bf16_implementation(int64_t M, int64_t N, int64_t K) {
  std::string why;
  return cache().probe(MatmulKey{false, true, M, N, K, K, K, N, 1.0f, 0.0f}, &why);
}

}  // namespace gale
