// Per-ISA f32 <-> bf16 conversion kernels behind convert_f32_to_bf16 / convert_bf16_to_f32
// (kernels/cpu/gemm.h), which dispatch on detected_isa().
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace gale {

void convert_f32_to_bf16_scalar(const float* x, bf16* y, int64_t n);
void convert_bf16_to_f32_scalar(const bf16* x, float* y, int64_t n);
void convert_f32_to_bf16_avx2(const float* x, bf16* y, int64_t n);
void convert_bf16_to_f32_avx2(const bf16* x, float* y, int64_t n);
void convert_f32_to_bf16_avx512(const float* x, bf16* y, int64_t n);
void convert_bf16_to_f32_avx512(const bf16* x, float* y, int64_t n);

}  // namespace gale
