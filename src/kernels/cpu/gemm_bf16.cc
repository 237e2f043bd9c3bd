// bf16 GEMM on oneDNN's matmul primitive, with primitives cached by shape.
#include <oneapi/dnnl/dnnl.hpp>

#include <map>
#include <mutex>
#include <tuple>

#include "core/check.h"
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

}  // namespace

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda,
               const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  GALE_CHECK(K > 0) << "gemm_bf16 with K = 0";
  const Matmul& m = cache().get(MatmulKey{trans_a, trans_b, M, N, K, lda, ldb, ldc, alpha, beta});
  const dnnl::engine& eng = cache().engine();
  dnnl::stream stream(eng);
  memory a(m.a, eng, const_cast<bf16*>(A)), b(m.b, eng, const_cast<bf16*>(B)), c(m.c, eng, C);
  m.primitive.execute(stream, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
  stream.wait();
}

std::string gemm_bf16_implementation(int64_t M, int64_t N, int64_t K) {
  return cache().get(MatmulKey{false, true, M, N, K, K, K, N, 1.0f, 0.0f}).impl;
}

}  // namespace gale
