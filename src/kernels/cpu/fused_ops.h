// Installing fused, vectorised kernels into an OpTable (the features manager's entry point).
//
// Every op group of OpTable::impl has a fused implementation in three builds: AVX-512, AVX2 and a
// one-lane baseline build ("fused-scalar": the same tiling and fusion, e.g. flash attention's
// O(S) memory, without vector instructions). install_fused_kernel picks the best build that is
// within both `max_isa` and detected_isa() (the CPU, capped by GALE_MAX_ISA) and names it in
// table.impl[op] ("fused-avx512", ...). Tolerances against the reference are stated and tested in
// tests/kernels/fused_vs_reference_test.cc; docs/kernels.md has the measured speed-ups.
//
//   OpTable ops = reference_ops();
//   GALE_RETURN_IF_ERROR(install_fused_kernel(ops, "attention", Isa::kAvx512));
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "kernels/cpu/fused_kernel_set.h"
#include "kernels/cpu/isa.h"
#include "kernels/op_table.h"

namespace gale {

// The op groups, in OpTable::impl's spelling: gemm, norm, bias_dropout_add, bias_dropout_add_norm,
// gelu, swiglu, geglu, rope, attention, embedding, lm_head_loss, adamw. "gemm" is not ISA code: it installs
// sgemm_partitioned (kernels/cpu/gemm.h) and names it "partitioned". "geglu" only names its build in
// table.impl (the model looks the kernels up by that name: kernels/cpu/fused_geglu.h).
std::vector<std::string> fused_kernel_ops();

// The build `op` would get under `max_isa`: min(max_isa, detected_isa()). Error for an unknown op.
StatusOr<Isa> fused_kernel_isa(const std::string& op, Isa max_isa);

// The name table.impl[op] gets for the build `isa`: "fused-<isa>", or "partitioned" for gemm.
std::string fused_kernel_name(const std::string& op, Isa isa);

// Replaces the entries of op group `op` with the fused build fused_kernel_isa(op, max_isa) and sets
// table.impl[op] = fused_kernel_name(op, isa). Error (table unchanged) for an unknown op.
Status install_fused_kernel(OpTable& table, const std::string& op, Isa max_isa);

// install_fused_kernel for every op group.
Status install_all_fused_kernels(OpTable& table, Isa max_isa);

// Σ x² with the best build under detected_isa(): the vectorised replacement of sum_of_squares
// (kernels/cpu/optimizer.h) for the optimizer's gradient norm (a proposed OpTable entry).
double fused_sum_of_squares(const float* x, int64_t n);

// Tokens per logits chunk of the fused LM head (tests, benchmarks): 0 restores the automatic size
// (about kLmHeadChunkBytes of logits, fused_lm_head_impl.h).
void set_lm_head_chunk_tokens(int64_t tokens);
int64_t lm_head_chunk_tokens_setting();

// The raw kernel set of one build, or nullptr when this CPU cannot run it (isa > hardware_isa()).
// For tests and benchmarks; ignores GALE_MAX_ISA.
const FusedKernelSet* fused_kernel_set(Isa isa);

}  // namespace gale
