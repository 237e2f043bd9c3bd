// OCP Microscaling (MX) fake quantisation: round f32 values to MXFP8 (E4M3 or E5M2) or MXFP4 (E2M1) and back.
//
// Format (OCP Microscaling Formats (MX) v1.0): each block of `block` consecutive elements of a row
// shares one E8M0 scale 2^s; every element is stored as an FP8 E4M3 (largest 448 = 1.75·2^8,
// smallest subnormal 2^-9), FP8 E5M2 (largest 57344 = 1.75·2^15, smallest subnormal 2^-16; the
// gradients of --fp8-recipe mxfp8 --fp8-format hybrid, model/fp8.h) or FP4 E2M1 (values 0, 0.5, 1, 1.5, 2, 3, 4, 6) number q, and stands
// for q·2^s. Fake quantisation returns q·2^s as f32: the value the low-precision weight means.
//
// Rules (the OCP specification's reference conversion, "floor" scale):
//   amax = max |x| over the block; a block of zeros stays zeros (signs kept);
//   s = floor(log2(amax)) − emax, emax = 8 (E4M3), 15 (E5M2) or 2 (E2M1), clamped to E8M0's [−127, 127];
//   v = x / 2^s, rounded to the element format to nearest, ties to even (subnormals included),
//   then saturated to ±max (a |v| beyond max, possible since amax / 2^s < 2^(emax+1), becomes ±max).
// The last block of a row may be shorter than `block` (a tail): it is its own block.
// A block holding Inf or NaN is passed through unchanged.
// Every step is exact in f32 (scaling by powers of two, rounding a value to a few bits), so the
// result does not depend on evaluation order: the vectorised version equals the reference bit for bit.
#pragma once

#include <cstdint>

namespace gale {

enum class MxElement { kNone, kFp8E4M3, kFp4E2M1, kFp8E5M2 };

// "fp8_e4m3", "fp8_e5m2", "fp4_e2m1" or "none".
const char* mx_element_name(MxElement e);
// The element format's largest finite magnitude (448, 57344 or 6) and its emax (8, 15 or 2).
float mx_element_max(MxElement e);
int mx_element_emax(MxElement e);

// out[r, :] = fake-quantised x[r, :] for rows × cols row-major values, blocks of `block` along each
// row (ld = cols). out may alias x. Level 0: plain and readable (frexp, nearbyint), one row at a time.
void mx_fake_quant_reference(const float* x, float* out, int64_t rows, int64_t cols, int64_t block, MxElement e);

// The same, bit for bit, with integer bit manipulation instead of libm calls, rows spread over the
// OpenMP threads (run sequentially inside a parallel region).
void mx_fake_quant(const float* x, float* out, int64_t rows, int64_t cols, int64_t block, MxElement e);

}  // namespace gale
