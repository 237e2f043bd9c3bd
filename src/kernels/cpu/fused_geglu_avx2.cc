// AVX2 build of the fused GeGLU kernels (erf and tanh GeLU gates).
// No implicit a·b + c -> fma contraction: the kernels write fmadd where they mean it.
#pragma GCC optimize("fp-contract=off")
#include "kernels/cpu/simd_avx2.h"
#include "kernels/cpu/fused_geglu.h"
#include "kernels/cpu/fused_geglu_impl.h"

namespace gale {

void add_geglu_kernels_avx2(GegluKernels* set) {
  set->forward = &fused::geglu_forward<simd::Avx2>;
  set->backward = &fused::geglu_backward<simd::Avx2>;
}

}  // namespace gale
