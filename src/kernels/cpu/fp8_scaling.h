// Per-tensor FP8 scaling of Transformer Engine's FP8 GEMM operands (--fp8-format, model/fp8.h):
// quantise-dequantise with a scale, the current-scaling scale and the delayed-scaling update.
//
// Quantise-dequantise (TE's cast to FP8 and the GEMM's dequantisation by scale_inv):
//   out_i = e(x_i · scale) · scale_inv,  e = round to the format (E4M3 "fn" max 448 or E5M2 max
//   57344), nearest even, subnormals included, saturating: |x · scale| beyond the largest value
//   and ±Inf give ±max (CUDA's __NV_SATFINITE cast that TE uses); NaN stays NaN. The codec is
//   kernels/cpu/quant_states.h's fp8_encode / fp8_decode (the one E4M3 and E5M2 codec of Gale).
// Current scaling (--fp8-recipe tensorwise, TE's Float8CurrentScaling): scale = fp8_max / amax of
//   the tensor itself (f32), FLT_MAX when that overflows, 1 when amax is 0 or not finite
//   (fp8_codec.h linear_scale); scale_inv = 1 / scale.
// Delayed scaling (--fp8-recipe delayed, TE's DelayedScaling): each tensor has an amax history of
//   `len` entries (--fp8-amax-history-len) and a scale. A quantisation uses the scale as it stands
//   and max-accumulates the tensor's amax into history[0]. The update (fp8_delayed_update, TE's
//   amax-and-scale update after the amax reduction):
//     amax  = max(history) (--fp8-amax-compute-algo max) or history[0] (most_recent)
//     scale = (fp8_max / amax) / 2^margin when amax is finite and > 0, else unchanged;
//             FLT_MAX when that is infinite
//     history rolled by one towards the front (history[i] = old[i + 1], history[len − 1] = old[0]),
//     then history[0] = 0 (the oldest entry, old[1], is dropped; len 1: history[0] = 0)
//   scale_inv = 1 / scale (f32). Before any update the scale is 1 and the history zeros.
// The amax ignores NaN (fmaxf, as TE's amax kernels) and counts ±Inf.
#pragma once

#include <cstdint>

#include "kernels/cpu/quant_states.h"

namespace gale {

enum class Fp8AmaxAlgo : uint8_t { kMostRecent, kMax };

// out[0, n) = e(x · scale) · scale_inv as above (out may alias x). Threads over the elements.
void fp8_fake_quant_scaled(const float* x, float* out, int64_t n, float scale, float scale_inv, Fp8Format f);
// max |x_i| over [0, n), NaN ignored (0 for n = 0).
float fp8_amax(const float* x, int64_t n);
// Current scaling's scale for `amax`: fp8_max(f) / amax (FLT_MAX on overflow; 1 for 0 or non-finite).
float fp8_current_scale(float amax, Fp8Format f);
// The delayed-scaling update of one tensor: history[i · stride] for i in [0, len), its scale.
void fp8_delayed_update(float* history, int64_t len, int64_t stride, float* scale, float fp8_max, int margin,
                        Fp8AmaxAlgo algo);
// amax max-accumulated into *slot (an f32 ≥ 0), atomically (experts running concurrently).
void fp8_record_amax(float* slot, float amax);

}  // namespace gale
