// AVX2 build of flash attention (forward and backward).
// No implicit a·b + c -> fma contraction: the kernels write fmadd where they mean it, and keep the
// reference's separate roundings elsewhere (the "exact" kernels of tests/kernels/fused_vs_reference_test.cc).
#pragma GCC optimize("fp-contract=off")
#include "kernels/cpu/simd_avx2.h"
#include "kernels/cpu/flash_attention_impl.h"
#include "kernels/cpu/fused_kernel_set.h"

namespace gale {

void add_attention_kernels_avx2(FusedKernelSet* set) {
  set->attention_forward = &fused::flash_attention_forward<simd::Avx2>;
  set->attention_backward = &fused::flash_attention_backward<simd::Avx2>;
}

}  // namespace gale
