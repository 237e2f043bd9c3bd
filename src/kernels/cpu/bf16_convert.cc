// f32 <-> bf16 conversion: baseline kernels and the ISA dispatch.
#include "kernels/cpu/bf16_convert.h"

#include "core/threads.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa.h"

namespace gale {

namespace {
constexpr int64_t kGrain = 1 << 16;
}  // namespace

void convert_f32_to_bf16_scalar(const float* x, bf16* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = float_to_bf16(x[i]);
}

void convert_bf16_to_f32_scalar(const bf16* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_float(x[i]);
}

void convert_f32_to_bf16(const float* x, bf16* y, int64_t n) {
  const Isa isa = detected_isa();
  auto fn = isa == Isa::kAvx512 ? convert_f32_to_bf16_avx512
            : isa == Isa::kAvx2 ? convert_f32_to_bf16_avx2
                                : convert_f32_to_bf16_scalar;
  parallel_for(n, kGrain, [&](int64_t b, int64_t e) { fn(x + b, y + b, e - b); });
}

void convert_bf16_to_f32(const bf16* x, float* y, int64_t n) {
  const Isa isa = detected_isa();
  auto fn = isa == Isa::kAvx512 ? convert_bf16_to_f32_avx512
            : isa == Isa::kAvx2 ? convert_bf16_to_f32_avx2
                                : convert_bf16_to_f32_scalar;
  parallel_for(n, kGrain, [&](int64_t b, int64_t e) { fn(x + b, y + b, e - b); });
}

}  // namespace gale
