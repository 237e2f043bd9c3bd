// Low-precision optimizer states (MindSpeed's --quant-states): FP8 or HiFloat8 codes with block
// scales for Adam's moments, the reference quantise/dequantise kernels and the fused AdamW that reads and
// writes the quantised moments in one pass.
//
// Three modes, as MindSpeed's quant_adamw.py (docs/model.md, "--quant-states"):
//
// kLinear (--quant-states fp8): a block of the state gets scale s = fmax / amax (f32; amax the
//   block's largest |x|; s = 1 for an all-zero block; FLT_MAX when the division overflows), its
//   elements become code = fp8(x · s), and dequantise to decode(code) · (1 / s). exp_avg uses E4M3
//   (fmax 448), exp_avg_sq E5M2 (fmax 57344). 4 bytes of scale per block.
// kMx (--quant-states mxfp8): MindSpeed's "k-scaling" first squares the value keeping its sign,
//   y = bf16(sign(x) · x²) (round to nearest even, as its .to(torch.bfloat16)); the block's shared
//   exponent is X = floor(log2(amax_y)) − emax (emax 8 for E4M3, 15 for E5M2: the OCP MX v1.0 rule;
//   X = −127 for an all-zero block; clamped to [−127, 127]), stored as the E8M0 byte X + 127, and
//   the elements become code = fp8(y · 2^−X). Dequantised: y' = decode(code) · 2^X, then
//   x' = sign(y') · sqrt(|y'|). exp_avg E4M3, exp_avg_sq E5M2; 1 byte of scale per block.
// kHiF8 (--quant-states hif8): both moments in HiFloat8 (below), blocks as kLinear, with MindSpeed's
//   scale for it: s = fl(fl(T / amax) / T), T its "fp8_max" of the moment (15 for exp_avg, 224 for
//   exp_avg_sq; QuantStateRef::target). MindSpeed multiplies by T / amax and then divides by T, so T
//   cancels up to float rounding: the block's largest magnitude lands at about 1.0 (3 mantissa
//   bits there), and a finite block's codes use HiF8's exponents ≤ 0 only. (T / amax is FLT_MAX
//   when the division overflows, 1 for an all-zero block, so that block's s is 1 / T.)
//   Dequantised: decode(code) · (1 / s). 4 bytes of scale per block.
//
// fp8() rounds to nearest, ties to even, with subnormals, and saturates at ±fmax (the scaled
// values never exceed fmax beyond float rounding, so torch's non-saturating cast gives the same
// codes). E4M3 is the "fn" variant (no infinities, 0x7F/0xFF NaN, never produced).
//
// HiFloat8 (Ascend, arXiv 2409.16626): sign bit, then a prefix-coded "dot" field giving the exponent
// width D, the exponent in D bits (sign-magnitude: its first bit the exponent's sign, the other D − 1
// the magnitude below an implicit leading 1, so |E| is in [2^(D−1), 2^D)), and the mantissa in what
// remains (tapered: 3 bits for |E| ≤ 3, 2 for |E| ≤ 7, 1 for |E| ≤ 15):
//   dot 0000 (denormal)  S 0000 mmm:   2^(m − 23), m = 1..7 (2^−22 .. 2^−16); m = 0: zero
//   dot 0001 (E = 0, M3) S 0001 mmm:   1.mmm
//   dot 001  (D = 1, M3) S 001 s mmm:  E = ±1
//   dot 01   (D = 2, M3) S 01 s e mmm: E = ±(2 + e)
//   dot 10   (D = 3, M2) S 10 s ee mm: E = ±(4 + ee)
//   dot 11   (D = 4, M1) S 11 s eee m: E = ±(8 + eee)
// (S the value's sign, s the exponent's, 1 = negative.)
// Special codes: 0x00 zero (the only one), 0x80 NaN, 0x6F / 0xEF ±Inf (E = 15 with mantissa 1, so
// the largest finite value is 2^15 = 32768, code 0x6E). hif8_encode rounds to nearest with ties away
// from zero (HiF8's rounding, "half to away", as Ascend's cast and the open-source emulations),
// on the binade's own mantissa width; magnitudes below 2^−23 become zero, [2^−23, 2^−22) becomes
// 2^−22; finite magnitudes that round to 1.5 · 2^15 or beyond saturate at ±32768 (a non-saturating
// cast gives Inf there; the scaled moments never come near); ±Inf → ±Inf; NaN → 0x80.
//
// Blocks (QuantLayout): a state piece of n elements is cut into blocks of `block` elements, the
// first one `first` elements long (≤ block: a piece that starts inside a block of its parameter),
// the last one whatever remains. Scales are stored one per block, in order.
#pragma once

#include <cstdint>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/optimizer.h"

namespace gale {

enum class Fp8Format : uint8_t { kE4M3, kE5M2, kHiF8 };
enum class QuantMode : uint8_t { kLinear, kMx, kHiF8 };

// MindSpeed's hif8 scale targets ("hif8_15", "hif8_224"): exp_avg's and exp_avg_sq's T.
inline constexpr float kHiF8TargetExpAvg = 15.0f;
inline constexpr float kHiF8TargetExpAvgSq = 224.0f;

// The largest finite value: 448 (E4M3), 57344 (E5M2) or 32768 (HiF8).
float fp8_max(Fp8Format f);
// fp8(x): round to nearest even, saturating at ±fp8_max (NaN maps to 0: never produced here);
// kHiF8: hif8_encode.
uint8_t fp8_encode(float x, Fp8Format f);
// The value of a code (NaN for E4M3's 0x7F/0xFF and E5M2's inf/NaN codes; kHiF8: hif8_decode).
float fp8_decode(uint8_t code, Fp8Format f);
// HiFloat8 (the format above): the reference encoder (ties away, saturating, NaN → 0x80, ±Inf kept)
// and decoder (0x80 NaN, 0x6F/0xEF ±Inf).
uint8_t hif8_encode(float x);
float hif8_decode(uint8_t code);
// f32 → bf16 → f32, round to nearest even (the k-scaling's cast).
float round_to_bf16(float x);

struct QuantLayout {
  QuantMode mode = QuantMode::kLinear;
  int64_t block = 128;  // elements per block
  int64_t first = 128;  // elements of the first block (1 ≤ first ≤ block)
};

// Blocks of a piece of n elements (0 for n = 0).
int64_t quant_num_blocks(int64_t n, const QuantLayout& layout);
// Bytes of one scale: 4 (kLinear and kHiF8, f32) or 1 (kMx, E8M0).
int64_t quant_scale_bytes(QuantMode mode);

// One quantised state piece: n codes and quant_num_blocks(n) scales (float* for kLinear and kHiF8,
// uint8_t* for kMx, given as bytes). kHiF8 takes format kHiF8 and the moment's scale target.
struct QuantStateRef {
  uint8_t* codes = nullptr;
  uint8_t* scales = nullptr;
  Fp8Format format = Fp8Format::kE4M3;
  float target = kHiF8TargetExpAvg;  // kHiF8 only: T (kHiF8TargetExpAvg or kHiF8TargetExpAvgSq)
};

// Reference (level 0) quantiser and dequantiser of x[0, n).
void quantise_state_ref(const float* x, int64_t n, const QuantLayout& layout, QuantStateRef out);
void dequantise_state_ref(QuantStateRef in, int64_t n, const QuantLayout& layout, float* x);

// The reference AdamW over quantised moments: dequantise both to f32, adamw_step_ref, quantise.
void adamw_step_quantised_ref(float* p, const float* g, QuantStateRef m, QuantStateRef v, int64_t n,
                              const QuantLayout& layout, const AdamWHyper& h);
// The same in one pass: each block's moments decoded, updated with the parameters, kept in a
// local buffer and encoded back (blocks in parallel). Bit-identical to the reference on every ISA
// tier; dispatches on detected_isa() (kernels/cpu/isa.h) to the builds below.
void adamw_step_quantised(float* p, const float* g, QuantStateRef m, QuantStateRef v, int64_t n,
                          const QuantLayout& layout, const AdamWHyper& h);
// One tier of it (tests, benchmarks): the one-lane baseline build, AVX2 and AVX-512
// (quant_states_impl.h; call a vector tier only when hardware_isa() has it).
void adamw_step_quantised_isa(Isa isa, float* p, const float* g, QuantStateRef m, QuantStateRef v, int64_t n,
                              const QuantLayout& layout, const AdamWHyper& h);
void adamw_step_quantised_scalar(float* p, const float* g, QuantStateRef m, QuantStateRef v, int64_t n,
                                 const QuantLayout& layout, const AdamWHyper& h);
void adamw_step_quantised_avx2(float* p, const float* g, QuantStateRef m, QuantStateRef v, int64_t n,
                               const QuantLayout& layout, const AdamWHyper& h);
void adamw_step_quantised_avx512(float* p, const float* g, QuantStateRef m, QuantStateRef v, int64_t n,
                                 const QuantLayout& layout, const AdamWHyper& h);

// quantise_state_ref / dequantise_state_ref, vectorised (bit-identical; dispatch on detected_isa()),
// and their per-ISA builds.
void quantise_state(const float* x, int64_t n, const QuantLayout& layout, QuantStateRef out);
void dequantise_state(QuantStateRef in, int64_t n, const QuantLayout& layout, float* x);
void quantise_state_isa(Isa isa, const float* x, int64_t n, const QuantLayout& layout, QuantStateRef out);
void dequantise_state_isa(Isa isa, QuantStateRef in, int64_t n, const QuantLayout& layout, float* x);
void quantise_state_scalar(const float* x, int64_t n, const QuantLayout& layout, QuantStateRef out);
void quantise_state_avx2(const float* x, int64_t n, const QuantLayout& layout, QuantStateRef out);
void quantise_state_avx512(const float* x, int64_t n, const QuantLayout& layout, QuantStateRef out);
void dequantise_state_scalar(QuantStateRef in, int64_t n, const QuantLayout& layout, float* x);
void dequantise_state_avx2(QuantStateRef in, int64_t n, const QuantLayout& layout, float* x);
void dequantise_state_avx512(QuantStateRef in, int64_t n, const QuantLayout& layout, float* x);

// fp8_decode of each of the 256 codes of a format (kHiF8 included).
const float* fp8_decode_table(Fp8Format f);

}  // namespace gale
