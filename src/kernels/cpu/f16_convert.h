// Per-ISA f32 <-> f16 conversion kernels behind convert_f32_to_f16 / convert_f16_to_f32
// (kernels/cpu/gemm.h), which dispatch on detected_isa(); AVX-512 CPUs use the AVX2 (F16C) kernels.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace gale {

void convert_f32_to_f16_scalar(const float* x, f16* y, int64_t n);
void convert_f16_to_f32_scalar(const f16* x, float* y, int64_t n);
void convert_f32_to_f16_avx2(const float* x, f16* y, int64_t n);
void convert_f16_to_f32_avx2(const f16* x, float* y, int64_t n);

}  // namespace gale
