// --quant-grads' codec: a main gradient held as FP16 codes with one f32 scale per parameter (MindSpeed's
// ScaleMeta "fp16" with the whole tensor as its block), and the accumulation of a gradient into it.
//
// Formats and rules (restated from MindSpeed's low_precision/quant_adamw.py ScaleMeta, qtype fp16):
//   scale      one f32 per parameter tensor, 1 initially, kept across iterations
//   scale_inv  1 / scale in f32 (1 where scale is 0, which the rule below never produces)
//   encode     q = fp16(x · scale), f32 multiply then round to nearest even (|x·scale| ≥ 65520: inf)
//   decode     x = float(q) · scale_inv
//   update     from amax = max |x| over the tensor (NaN when any element is NaN):
//              scale = 65503 / amax when amax > 0 and finite, else the old scale is kept;
//              a quotient that overflows to infinity (amax below about 1.9e-34) becomes FLT_MAX
// Accumulating a gradient g into the held one (MindSpeed's backward hook, once per parameter and
// micro-batch): x = decode(q) + g in f32, update the scale from x, q = encode(x).
// Aligning a data-parallel group (MindSpeed's start_grad_sync hook): every rank takes the MIN of the
// group's scales; where its own scale changes, q = fp16(float(q) · (new / old)) (ratio in f32).
//
// The f32 arithmetic is element by element; the FP16 conversions use the F16C kernels where the CPU
// has them, else the scalar ones (core/dtype.h float_to_f16, round to nearest even: the same bits).
// tools/reference/quant_grads_reference.py restates all of it in numpy and
// tests/kernels/quant_grads_test.cc holds this code to its fixture.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace gale {

// MindSpeed's fp16 target: the scale maps the largest magnitude to 65503 (just under FP16's 65504).
inline constexpr float kQuantGradTarget = 65503.0f;

// max |x[i]| over n elements; NaN when any element is NaN; 0 for n = 0.
float quant_grad_amax(const float* x, int64_t n);
// The scale rule above from `amax` and the current scale.
float quant_grad_update_scale(float amax, float old_scale);
// 1 / scale in f32, 1 for a zero scale.
float quant_grad_scale_inv(float scale);
// q[i] = fp16(x[i] · scale).
void quant_grad_encode(const float* x, int64_t n, float scale, f16* q);
// x[i] = float(q[i]) · scale_inv(scale).
void quant_grad_decode(const f16* q, int64_t n, float scale, float* x);
// Accumulates g into the held gradient (q, *scale): x = decode(q) + g, *scale updated from amax(x),
// q = encode(x). `g` is used as the f32 scratch and left zero (the next contribution's target).
void quant_grad_accumulate(f16* q, float* g, int64_t n, float* scale);
// The end of the data-parallel sum: x holds summed values in the scaled domain; q = fp16(x), then
// x = float(q) · scale_inv(scale) (the dequantised main gradient).
void quant_grad_round_and_decode(float* x, int64_t n, float scale, f16* q);
// Brings q from scale `old_scale` to `new_scale`: q = fp16(float(q) · fl(new / old)); zero when
// old_scale is 0. Nothing when they are equal.
void quant_grad_rescale(f16* q, int64_t n, float old_scale, float new_scale);

}  // namespace gale
