// FP8 element formats and the E8M0 block-scale rule shared by --quant-states (quant_states.h) and
// --qat-scheme's MX fake quantiser (mx_quant.h): one definition of E4M3/E5M2 and of the scale rules
// (HiFloat8's codec is quant_states.h's hif8_encode / hif8_decode; its block scale is here).
//
// Header-only and safe in the ISA files (*_avx2.cc, *_avx512.cc): constants, and always-inlined
// bit manipulation that calls no library function (the rule in kernels/cpu/isa.h).
#pragma once

#include <cstdint>
#include <cstring>

namespace gale::fp8 {

// An FP8 format: E4M3 is the "fn" variant (no infinities; 0x7F/0xFF NaN), E5M2 IEEE-like.
struct Spec {
  int mant;          // mantissa bits
  int bias;          // exponent bias
  uint8_t max_code;  // magnitude code of the largest finite value
  float max;         // the largest finite value
  int emax;          // exponent of the largest normal binade (the OCP MX emax_elem)
  int emin;          // exponent of the smallest normal binade, 1 − bias
  float min_normal;  // 2^emin
  float sub_scale;   // 2^(bias − 1 + mant): |x| · sub_scale is the subnormal code of |x| < min_normal
};

inline constexpr Spec kE4M3{3, 7, 0x7E, 448.0f, 8, -6, 0x1p-6f, 0x1p9f};
inline constexpr Spec kE5M2{2, 15, 0x7B, 57344.0f, 15, -14, 0x1p-14f, 0x1p16f};

#define GALE_FP8_INLINE __attribute__((always_inline)) inline

GALE_FP8_INLINE uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
GALE_FP8_INLINE float float_of(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// 2^k as an f32 for k in [−127, 127] (2^−127 is subnormal): an E8M0 scale's value.
GALE_FP8_INLINE float pow2(int k) {
  return k >= -126 ? float_of(static_cast<uint32_t>(k + 127) << 23) : float_of(1u << 22);
}

// The E8M0 shared exponent of a block whose largest magnitude is `amax` (≥ 0, not NaN), for an
// element format of exponent `emax` (OCP MX v1.0, "floor" rule): floor(log2(amax)) − emax clamped
// to [−127, 127]; −127 for amax = 0, 127 for amax = +inf (= clamp(ilogb(amax) − emax), exactly,
// subnormal amax included).
GALE_FP8_INLINE int e8m0_exponent(float amax, int emax) {
  const uint32_t u = bits_of(amax) & 0x7FFFFFFFu;
  if (u == 0) return -127;
  const int biased = static_cast<int>(u >> 23);
  if (biased == 255) return 127;
  const int floor_log2 = biased != 0 ? biased - 127 : (31 - __builtin_clz(u)) - 149;
  const int e = floor_log2 - emax;
  return e < -127 ? -127 : e > 127 ? 127 : e;
}

// --quant-states fp8's per-block scale: fmax / amax (FLT_MAX when that overflows), 1 for an
// all-zero or non-finite amax.
GALE_FP8_INLINE float linear_scale(float amax, float fmax) {
  if (!(amax > 0.0f) || __builtin_isinf(amax)) return 1.0f;
  const float s = fmax / amax;
  return __builtin_isinf(s) ? 3.40282347e+38f : s;
}

// --quant-states hif8's per-block scale, MindSpeed's: fl(fl(target / amax) / target) with target / amax
// as linear_scale has it (FLT_MAX on overflow, 1 for an all-zero or non-finite amax).
GALE_FP8_INLINE float hif8_scale(float amax, float target) { return linear_scale(amax, target) / target; }

}  // namespace gale::fp8
