// AVX-512 build of the fused row kernels: norms, residual + dropout (+ norm), activations, RoPE, embedding, AdamW.
// No implicit a·b + c -> fma contraction: the kernels write fmadd where they mean it, and keep the
// reference's separate roundings elsewhere (the "exact" kernels of tests/kernels/fused_vs_reference_test.cc).
#pragma GCC optimize("fp-contract=off")
#include "kernels/cpu/simd_avx512.h"
#include "kernels/cpu/fused_elementwise_set_impl.h"

namespace gale {

void add_elementwise_kernels_avx512(FusedKernelSet* set) { fused::fill_elementwise<simd::Avx512>(set); }

}  // namespace gale
