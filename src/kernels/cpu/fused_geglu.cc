// Fused GeGLU kernel sets per ISA, and the lookup of the build an OpTable names.
#include "kernels/cpu/fused_geglu.h"

#include "kernels/cpu/fused_ops.h"

namespace gale {

namespace {

GegluKernels build_set(Isa isa) {
  GegluKernels s;
  s.isa = isa_name(isa);
  switch (isa) {
    case Isa::kScalar:
      add_geglu_kernels_scalar(&s);
      break;
    case Isa::kAvx2:
      add_geglu_kernels_avx2(&s);
      break;
    case Isa::kAvx512:
      add_geglu_kernels_avx512(&s);
      break;
  }
  return s;
}

}  // namespace

const GegluKernels* fused_geglu_kernels(Isa isa) {
  // Only the ISAs this CPU runs are built (see fused_kernel_set in fused_ops.cc: filling a table in
  // an AVX-512 file may itself use AVX-512 instructions).
  static const Isa hardware = hardware_isa();
  static const GegluKernels sets[3] = {
      build_set(Isa::kScalar),
      hardware >= Isa::kAvx2 ? build_set(Isa::kAvx2) : GegluKernels{},
      hardware >= Isa::kAvx512 ? build_set(Isa::kAvx512) : GegluKernels{},
  };
  if (static_cast<int>(isa) > static_cast<int>(hardware)) return nullptr;
  return &sets[static_cast<int>(isa)];
}

GegluKernels geglu_kernels(const OpTable& ops) {
  const auto it = ops.impl.find("geglu");
  if (it != ops.impl.end())
    for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512})
      if (it->second == fused_kernel_name("geglu", isa)) {
        const GegluKernels* s = fused_geglu_kernels(isa);
        if (s != nullptr) return *s;
      }
  return GegluKernels{};
}

}  // namespace gale
