// Per-tensor scaled optimizer moments of Megatron's precision-aware optimizer
// (--use-precision-aware-optimizer --exp-avg-dtype / --exp-avg-sq-dtype fp16|fp8), as Transformer
// Engine's FusedAdam stores them: one f32 scale per tensor (here: per optimizer segment, the piece of
// one parameter this rank updates, which is what Megatron's distributed optimizer hands to FusedAdam).
//
// Quantising x[0, n) (after every step, from the step's f32 values):
//   amax  = max |x_i|                           (0 for n = 0)
//   scale = amax / R                            (f32 division; R = 32752 = 65504 / 2 for fp16,
//                                                448 for fp8, E4M3's largest value)
//   fp16: code_i = f16(x_i · r),  r = 1 / scale (0 when scale is 0)       (round to nearest even)
//   fp8:  code_i = e4m3(x_i · q), q = 1 / scale                          (round to nearest even,
//         saturating at ±448; Gale writes code 0 for every element when scale is 0, where TE's
//         1 / 0 would make every code NaN: an all-zero piece stays zero)
// Dequantising (before the step):
//   fp16: x_i = f32(code_i) · scale
//   fp8:  x_i = e4m3value(code_i) · (1 / q)     (TE keeps the quantiser's 1 / scale and its
//         reciprocal; 0 when scale is 0)
// The number formats are Gale's single codecs: core/dtype.h's f16 (convert_f32_to_f16 /
// convert_f16_to_f32, vectorised) and kernels/cpu/quant_states.h's E4M3 (fp8_encode / fp8_decode).
#pragma once

#include <cstdint>
#include <string>

#include "kernels/cpu/optimizer.h"

namespace gale {

enum class StateDType : uint8_t { kF32, kF16, kFP8 };

// "fp32", "fp16" or "fp8" (Megatron's --exp-avg-dtype choices); false for anything else.
bool parse_state_dtype(const std::string& name, StateDType* out);
const char* state_dtype_name(StateDType d);
// Bytes of one stored element: 4, 2 or 1.
int64_t state_dtype_bytes(StateDType d);
// R above: 32752 (fp16) or 448 (fp8).
float scaled_state_range(StateDType d);

// One scaled moment piece: n codes (f16 or u8 E4M3) and its scale (one f32). kF32: `codes` are f32
// values and the scale is unused.
struct ScaledStateRef {
  void* codes = nullptr;
  float* scale = nullptr;
  StateDType dtype = StateDType::kF32;
};

// x[0, n) → codes and scale (x is overwritten with the scaled values, as TE's in-place multiply).
void quantise_scaled_state(float* x, int64_t n, ScaledStateRef out);
// codes and scale → x[0, n).
void dequantise_scaled_state(ScaledStateRef in, int64_t n, float* x);

// AdamW (adamw_step, the op table's) over scaled moments: both dequantised into the f32 scratch
// m32, v32 (n elements each), updated with the parameters by `step` (the op table's AdamW), and
// quantised again with new scales. An f32 moment is updated in place.
void adamw_step_scaled(float* p, const float* g, ScaledStateRef m, ScaledStateRef v, int64_t n,
                       const AdamWHyper& h, float* m32, float* v32,
                       void (*step)(float*, const float*, float*, float*, int64_t, const AdamWHyper&));

}  // namespace gale
