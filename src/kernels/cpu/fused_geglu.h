// Fused GeGLU kernels (scalar, AVX2, AVX-512 builds) and the choice between them and the reference.
//
// The op group "geglu" of OpTable::impl (kernels/cpu/fused_ops.h) names the build the model runs:
// "reference" (level 0, kernels/cpu/geglu.h) or "fused-<isa>" (installed with the fused SwiGLU,
// --use-fused-swiglu, level 2). The OpTable has no function entries for GeGLU: geglu_kernels()
// resolves impl["geglu"] to the kernels (model/mlp_activation.h calls it once per MLP call).
//
// Tolerance against the reference: ≤ 1e-6 of each output array's peak (vector erf/exp ≤ 2.5 ulp;
// the tanh form is computed as a·sigmoid(2z)); tested in tests/kernels/fused_geglu_test.cc.
#pragma once

#include "kernels/cpu/geglu.h"
#include "kernels/cpu/isa.h"
#include "kernels/op_table.h"

namespace gale {

struct GegluKernels {
  const char* isa = nullptr;  // nullptr: the reference kernels
  GegluForwardFn forward = geglu_forward_ref;
  GegluBackwardFn backward = geglu_backward_ref;
};

// The fused build for `isa`, or nullptr when this CPU cannot run it (isa > hardware_isa()). Ignores GALE_MAX_ISA.
const GegluKernels* fused_geglu_kernels(Isa isa);

// The kernels ops.impl["geglu"] names: a fused build for "fused-<isa>", the reference otherwise
// (also when the table has no "geglu" entry).
GegluKernels geglu_kernels(const OpTable& ops);

// Filled by the per-ISA instantiation files (fused_geglu_<isa>.cc).
void add_geglu_kernels_scalar(GegluKernels* set);
void add_geglu_kernels_avx2(GegluKernels* set);
void add_geglu_kernels_avx512(GegluKernels* set);

}  // namespace gale
