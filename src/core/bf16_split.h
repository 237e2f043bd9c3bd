// An f32 value as its round-to-nearest-even bf16 value plus a 16-bit residual, and back, bit for
// bit (--reuse-fp32-param, model/params.h; MindSpeed's ReuseFP32Param).
//
// With u the f32 bits, t = u >> 16 and low = u & 0xffff:
//   b = float_to_bf16(f) (core/dtype.h: round to nearest even; NaN → the quiet NaN t | 0x40),
//   r = low,
//   tie_down = f is not NaN and u's low 17 bits are 0x08000 (an exact tie, t even, rounded down).
// b rounded up (b = t + 1) exactly when b is not NaN and r > 0x8000, or r = 0x8000 and not
// tie_down; then t = b − 1, else t = b (for a NaN, t | 0x40 = b). An even b has 65537 f32 values
// that round to it, one more than r can tell apart: tie_down is that extra bit, needed only for
// the exact ties that round down (the caller keeps it apart, e.g. as a list of indices).
// Every f32 but a NaN is reconstructed bit for bit (±0, denormals, ±Inf, finite values near
// FLT_MAX whose b is ±Inf); a NaN comes back as a NaN of the same sign and payload with the quiet
// bit set.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/dtype.h"

namespace gale {

inline bool bf16_split_tie_down(uint32_t u) {
  return (u & 0x7fffffffu) <= 0x7f800000u && (u & 0x1ffffu) == 0x08000u;
}

// f → (b, r); returns tie_down.
inline bool split_f32_to_bf16_residual(float f, uint16_t* b, uint16_t* r) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  *b = float_to_bf16(f).bits;
  *r = static_cast<uint16_t>(u & 0xffffu);
  return bf16_split_tie_down(u);
}

// (b, r, tie_down) → f.
inline float merge_bf16_residual_to_f32(uint16_t b, uint16_t r, bool tie_down) {
  const bool nan = (b & 0x7fffu) > 0x7f80u;
  const bool rounded_up = !nan && (r > 0x8000u || (r == 0x8000u && !tie_down));
  const uint32_t u = ((static_cast<uint32_t>(b) << 16) | r) - (rounded_up ? 0x10000u : 0u);
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace gale
