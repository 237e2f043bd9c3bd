// Baseline x86-64 (one-lane) build of the fused row kernels: norms, residual + dropout (+ norm), activations, RoPE, embedding, AdamW.
// No implicit a·b + c -> fma contraction: the kernels write fmadd where they mean it, and keep the
// reference's separate roundings elsewhere (the "exact" kernels of tests/kernels/fused_vs_reference_test.cc).
#pragma GCC optimize("fp-contract=off")
#include "kernels/cpu/simd_scalar.h"
#include "kernels/cpu/fused_elementwise_set_impl.h"

namespace gale {

void add_elementwise_kernels_scalar(FusedKernelSet* set) { fused::fill_elementwise<simd::Scalar>(set); }

}  // namespace gale
