// AVX-512 build of the chunked LM head + cross-entropy.
// No implicit a·b + c -> fma contraction: the kernels write fmadd where they mean it, and keep the
// reference's separate roundings elsewhere (the "exact" kernels of tests/kernels/fused_vs_reference_test.cc).
#pragma GCC optimize("fp-contract=off")
#include "kernels/cpu/simd_avx512.h"
#include "kernels/cpu/fused_kernel_set.h"
#include "kernels/cpu/fused_lm_head_impl.h"

namespace gale {

void add_lm_head_kernels_avx512(FusedKernelSet* set) {
  set->lm_head_loss_forward = &fused::lm_head_loss_forward<simd::Avx512>;
  set->lm_head_loss_backward = &fused::lm_head_loss_backward<simd::Avx512>;
}

}  // namespace gale
