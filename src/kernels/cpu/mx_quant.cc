// MX (OCP Microscaling) fake quantisation: the readable reference and the bit-manipulating version.
#include "kernels/cpu/mx_quant.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "core/threads.h"
#include "kernels/cpu/fp8_codec.h"

namespace gale {

namespace {

// An element format: mantissa bits, smallest normal exponent, largest exponent, largest value.
struct ElementFormat {
  int mbits = 0;
  int emin = 0;
  int emax = 0;
  float max = 0.0f;
};

ElementFormat element_format(MxElement e) {
  switch (e) {
    case MxElement::kFp8E4M3: return {fp8::kE4M3.mant, fp8::kE4M3.emin, fp8::kE4M3.emax, fp8::kE4M3.max};
    case MxElement::kFp8E5M2: return {fp8::kE5M2.mant, fp8::kE5M2.emin, fp8::kE5M2.emax, fp8::kE5M2.max};
    case MxElement::kFp4E2M1: return {1, 0, 2, 6.0f};
    case MxElement::kNone: break;
  }
  GALE_CHECK(false) << "MX fake quantisation without an element format";
  return {};
}

constexpr int kScaleMin = -127, kScaleMax = 127;  // E8M0 exponents (0xFF is its NaN)

inline uint32_t bits_of(float f) { return std::bit_cast<uint32_t>(f); }
inline float float_of(uint32_t u) { return std::bit_cast<float>(u); }

// ---- Level 0: the rules as written (libm) ----

// v (already divided by the block's scale) to the nearest element value, ties to even, saturated.
float quantise_element_reference(float v, const ElementFormat& f) {
  const float a = std::fabs(v);
  if (a >= f.max) return std::copysign(f.max, v);
  int e = 0;
  std::frexp(a, &e);                            // a = m·2^e, m in [0.5, 1): floor(log2 a) = e − 1
  const int exponent = std::max(e - 1, f.emin);  // below 2^emin: the subnormal spacing
  const float step = std::ldexp(1.0f, exponent - f.mbits);
  const float q = std::nearbyint(v / step) * step;  // default rounding mode: to nearest, ties to even
  return std::fabs(q) > f.max ? std::copysign(f.max, v) : q;
}

void quantise_block_reference(const float* x, float* out, int64_t n, const ElementFormat& f) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) {  // Inf / NaN: the block passes through
      std::memmove(out, x, static_cast<size_t>(n) * sizeof(float));
      return;
    }
    amax = std::max(amax, std::fabs(x[i]));
  }
  if (amax == 0.0f) {  // zeros stay (signed) zeros
    std::memmove(out, x, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  int e = 0;
  std::frexp(amax, &e);
  const int s = std::clamp(e - 1 - f.emax, kScaleMin, kScaleMax);
  for (int64_t i = 0; i < n; ++i) out[i] = std::ldexp(quantise_element_reference(std::ldexp(x[i], -s), f), s);
}

// ---- The same with integer bit manipulation ----

struct FastFormat {
  ElementFormat f;
  uint32_t shift = 0;   // 23 − mbits: the f32 mantissa bits dropped in the normal range
  float normal_min = 0;  // 2^emin
  float magic = 0;       // 2^(emin − mbits + 23): adding it rounds [0, 2^emin) to the subnormal step
};

FastFormat fast_format(MxElement e) {
  FastFormat ff;
  ff.f = element_format(e);
  ff.shift = static_cast<uint32_t>(23 - ff.f.mbits);
  ff.normal_min = std::ldexp(1.0f, ff.f.emin);
  ff.magic = std::ldexp(1.0f, ff.f.emin - ff.f.mbits + 23);
  return ff;
}

void quantise_block_fast(const float* x, float* out, int64_t n, const FastFormat& ff) {
  uint32_t amax_bits = 0;  // |x| bits: NaN > Inf > every finite value, as unsigned integers
#pragma omp simd reduction(max : amax_bits)
  for (int64_t i = 0; i < n; ++i) amax_bits = std::max(amax_bits, bits_of(x[i]) & 0x7fffffffu);
  if (amax_bits == 0 || amax_bits >= 0x7f800000u) {  // zeros, or a non-finite value: unchanged
    std::memmove(out, x, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  // floor(log2(amax)) − emax from the exponent field, clamped to E8M0's range (fp8_codec.h).
  const int s = fp8::e8m0_exponent(float_of(amax_bits), ff.f.emax);
  const float down = fp8::pow2(-s), up = fp8::pow2(s);
  const uint32_t half = (1u << (ff.shift - 1)) - 1, keep = ~((1u << ff.shift) - 1);
  const float magic = ff.magic;
  const uint32_t shift = ff.shift, max_bits = bits_of(ff.f.max), normal_min_bits = bits_of(ff.normal_min);
  // Integer compares and masks instead of branches (|values| compare as their bits), so the loop
  // vectorises; element-wise, the same operations on every lane.
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t vb = bits_of(x[i] * down);  // exact, as ldexp (a product in the subnormal range rounds alike)
    const uint32_t sign = vb & 0x80000000u, ab = vb & 0x7fffffffu;
    // Normal range: round the mantissa to mbits bits, ties to even (a carry moves into the exponent).
    const uint32_t normal = (ab + half + ((ab >> shift) & 1u)) & keep;
    // Below 2^emin: the spacing is fixed; the f32 addition rounds to it (to nearest even).
    const uint32_t sub = bits_of((float_of(ab) + magic) - magic);
    const uint32_t use_sub = 0u - static_cast<uint32_t>(ab < normal_min_bits);
    uint32_t q = (sub & use_sub) | (normal & ~use_sub);
    q = q < max_bits ? q : max_bits;  // saturation (also of a rounded-up value)
    out[i] = float_of(q | sign) * up;
  }
}

}  // namespace

const char* mx_element_name(MxElement e) {
  switch (e) {
    case MxElement::kFp8E4M3: return "fp8_e4m3";
    case MxElement::kFp8E5M2: return "fp8_e5m2";
    case MxElement::kFp4E2M1: return "fp4_e2m1";
    case MxElement::kNone: break;
  }
  return "none";
}

float mx_element_max(MxElement e) { return element_format(e).max; }
int mx_element_emax(MxElement e) { return element_format(e).emax; }

void mx_fake_quant_reference(const float* x, float* out, int64_t rows, int64_t cols, int64_t block, MxElement e) {
  GALE_CHECK(block > 0) << "MX block size " << block;
  const ElementFormat f = element_format(e);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; c += block)
      quantise_block_reference(x + r * cols + c, out + r * cols + c, std::min(block, cols - c), f);
}

void mx_fake_quant(const float* x, float* out, int64_t rows, int64_t cols, int64_t block, MxElement e) {
  GALE_CHECK(block > 0) << "MX block size " << block;
  const FastFormat ff = fast_format(e);
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(cols, 1));
  parallel_for(rows, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = 0; c < cols; c += block)
        quantise_block_fast(x + r * cols + c, out + r * cols + c, std::min(block, cols - c), ff);
  });
}

}  // namespace gale
