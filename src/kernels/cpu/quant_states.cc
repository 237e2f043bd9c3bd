// FP8 and HiFloat8 state codes, block scaling, and the reference and fused AdamW over quantised moments.
#include "kernels/cpu/quant_states.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/check.h"
#include "core/threads.h"
#include "kernels/cpu/fp8_codec.h"

namespace gale {

namespace {

using Fp8Spec = fp8::Spec;
using fp8::bits_of;
using fp8::float_of;

constexpr const Fp8Spec& spec_of(Fp8Format f) { return f == Fp8Format::kE4M3 ? fp8::kE4M3 : fp8::kE5M2; }

// HiF8's mantissa width for a value of exponent e (|e| ≤ 15; denormals have none).
int hif8_mantissa_bits(int e) {
  const int a = e < 0 ? -e : e;
  return a <= 3 ? 3 : a <= 7 ? 2 : a <= 15 ? 1 : 0;
}

// Decoding tables, one per format.
const std::array<float, 256>& decode_table(Fp8Format f) {
  static const std::array<float, 256> hif8 = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[static_cast<size_t>(c)] = hif8_decode(static_cast<uint8_t>(c));
    return t;
  }();
  if (f == Fp8Format::kHiF8) return hif8;
  static const std::array<float, 256> e4m3 = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[static_cast<size_t>(c)] = fp8_decode(static_cast<uint8_t>(c), Fp8Format::kE4M3);
    return t;
  }();
  static const std::array<float, 256> e5m2 = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[static_cast<size_t>(c)] = fp8_decode(static_cast<uint8_t>(c), Fp8Format::kE5M2);
    return t;
  }();
  return f == Fp8Format::kE4M3 ? e4m3 : e5m2;
}

// Where block `b` of a piece starts.
inline int64_t block_start(int64_t b, const QuantLayout& l) { return b == 0 ? 0 : l.first + (b - 1) * l.block; }

// MindSpeed's f_signed_power: sign-keeping square (before quantising) and square root (after).
inline float signed_square(float x) { return x >= 0.0f ? x * x : -(x * x); }
inline float signed_sqrt(float y) { return y >= 0.0f ? std::sqrt(y) : -std::sqrt(-y); }

// Quantises block x[0, len) into codes[0, len) and its scale (slot `b` of `scales`). `tmp` holds
// len floats (kMx: the k-scaled values); `target` is kHiF8's T.
void quantise_block(const float* x, int64_t len, QuantMode mode, Fp8Format format, float target, uint8_t* codes,
                    uint8_t* scales, int64_t b, float* tmp) {
  if (mode == QuantMode::kHiF8) {
    float amax = 0.0f;
    for (int64_t i = 0; i < len; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float scale = fp8::hif8_scale(amax, target);
    for (int64_t i = 0; i < len; ++i) codes[i] = hif8_encode(x[i] * scale);
    std::memcpy(scales + b * 4, &scale, sizeof scale);
    return;
  }
  const Fp8Spec s = spec_of(format);
  if (mode == QuantMode::kLinear) {
    float amax = 0.0f;
    for (int64_t i = 0; i < len; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float scale = fp8::linear_scale(amax, s.max);  // 1 for an all-zero block (MindSpeed keeps
                                                         // the previous scale: the same zeros)
    for (int64_t i = 0; i < len; ++i) codes[i] = fp8_encode(x[i] * scale, format);
    std::memcpy(scales + b * 4, &scale, sizeof scale);
    return;
  }
  float amax = 0.0f;
  for (int64_t i = 0; i < len; ++i) {
    tmp[i] = round_to_bf16(signed_square(x[i]));
    amax = std::max(amax, std::fabs(tmp[i]));
  }
  const int exponent = fp8::e8m0_exponent(amax, s.emax);
  const float inv = fp8::pow2(-exponent);  // a power of two: the product is ldexp's, exactly
  for (int64_t i = 0; i < len; ++i) codes[i] = fp8_encode(tmp[i] * inv, format);
  scales[b] = static_cast<uint8_t>(exponent + 127);
}

void dequantise_block(const uint8_t* codes, int64_t len, QuantMode mode, Fp8Format format, const uint8_t* scales,
                      int64_t b, float* x) {
  const std::array<float, 256>& table = decode_table(format);
  if (mode != QuantMode::kMx) {  // kLinear, kHiF8
    float scale;
    std::memcpy(&scale, scales + b * 4, sizeof scale);
    const float inv = 1.0f / scale;
    for (int64_t i = 0; i < len; ++i) x[i] = table[codes[i]] * inv;
    return;
  }
  const float scale = fp8::pow2(static_cast<int>(scales[b]) - 127);  // exact, as above
  for (int64_t i = 0; i < len; ++i) x[i] = signed_sqrt(table[codes[i]] * scale);
}

// The layout's blocks are well formed and the piece's format is the mode's (kHiF8 ⇔ HiF8 codes
// with a positive target).
void check_layout(const QuantLayout& l, const QuantStateRef& r) {
  GALE_CHECK(l.block > 0 && l.first > 0 && l.first <= l.block) << "quantisation blocks " << l.first << "/" << l.block;
  GALE_CHECK((l.mode == QuantMode::kHiF8) == (r.format == Fp8Format::kHiF8))
      << "--quant-states: HiF8 codes go with the kHiF8 mode and only with it";
  GALE_CHECK(l.mode != QuantMode::kHiF8 || r.target > 0.0f) << "--quant-states hif8: scale target " << r.target;
}

}  // namespace

float fp8_max(Fp8Format f) { return f == Fp8Format::kHiF8 ? 32768.0f : spec_of(f).max; }

uint8_t hif8_encode(float x) {
  const uint32_t u = bits_of(x);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return 0x80;                            // NaN
  if (a == 0x7F800000u) return static_cast<uint8_t>(sign | 0x6F);  // ±Inf
  const int e = static_cast<int>(a >> 23) - 127;
  if (e < -23) return 0;  // below half the smallest denormal (f32 zeros and subnormals too): the one zero
  // Round half away from zero on this binade's mantissa width: add half a unit, cut the rest off.
  const int cut = 23 - hif8_mantissa_bits(e);
  const uint32_t r = (a + (1u << (cut - 1))) & ~((1u << cut) - 1u);
  if (r >= 0x47400000u) return static_cast<uint8_t>(sign | 0x6E);  // ≥ 1.5 · 2^15: saturate at 32768
  const int e2 = static_cast<int>(r >> 23) - 127;  // a carry may have moved it up one binade
  if (e2 <= -16) return static_cast<uint8_t>(sign | (std::max(e2, -22) + 23));  // denormal 2^(m − 23)
  const int m2 = hif8_mantissa_bits(e2);
  const uint32_t mant = (r & 0x7FFFFFu) >> (23 - m2);
  const uint32_t ae = static_cast<uint32_t>(e2 < 0 ? -e2 : e2), neg = e2 < 0 ? 1u : 0u;
  uint32_t code;
  if (ae == 0) {
    code = 0x08u | mant;
  } else if (ae == 1) {
    code = 0x10u | neg << 3 | mant;
  } else if (ae <= 3) {
    code = 0x20u | neg << 4 | (ae - 2) << 3 | mant;
  } else if (ae <= 7) {
    code = 0x40u | neg << 4 | (ae - 4) << 2 | mant;
  } else {
    code = 0x60u | neg << 4 | (ae - 8) << 1 | mant;
  }
  return static_cast<uint8_t>(sign | code);
}

float hif8_decode(uint8_t code) {
  if (code == 0x80) return std::numeric_limits<float>::quiet_NaN();
  const bool negative = (code & 0x80) != 0;
  const int v = code & 0x7F;
  float r;
  if (v == 0x6F) {
    r = std::numeric_limits<float>::infinity();
  } else if (v < 0x08) {  // dot 0000: zero or a denormal
    r = v == 0 ? 0.0f : std::ldexp(1.0f, v - 23);
  } else {
    int e, mbits;
    if (v < 0x10) {  // dot 0001
      e = 0;
      mbits = 3;
    } else if (v < 0x20) {  // dot 001
      e = (v & 0x08) ? -1 : 1;
      mbits = 3;
    } else {  // dot 01, 10, 11: D = 2, 3, 4 exponent bits, 5 − D mantissa bits
      const int d = ((v >> 5) & 3) + 1;
      mbits = 5 - d;
      const int magnitude = (1 << (d - 1)) + ((v >> mbits) & ((1 << (d - 1)) - 1));
      e = (v & 0x10) ? -magnitude : magnitude;
    }
    const int m = v & ((1 << mbits) - 1);
    r = std::ldexp(static_cast<float>((1 << mbits) + m), e - mbits);
  }
  return negative ? -r : r;
}

uint8_t fp8_encode(float x, Fp8Format f) {
  if (f == Fp8Format::kHiF8) return hif8_encode(x);
  const Fp8Spec s = spec_of(f);
  uint32_t u = bits_of(x);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  u &= 0x7FFFFFFFu;
  if (u > 0x7F800000u) return 0;  // NaN
  const float a = float_of(u);
  if (a >= s.max) return static_cast<uint8_t>(sign | s.max_code);
  if (a < s.min_normal) {  // the subnormal grid: multiples of 2^(1 − bias − mant); may round up to min_normal
    const float q = std::nearbyint(a * s.sub_scale);  // exact product (a power of two, no overflow)
    return static_cast<uint8_t>(sign | static_cast<uint8_t>(q));
  }
  const int shift = 23 - s.mant;
  uint32_t r = u + ((1u << (shift - 1)) - 1u) + ((u >> shift) & 1u);  // round to nearest even
  r >>= shift;
  r -= static_cast<uint32_t>(127 - s.bias) << s.mant;
  if (r > s.max_code) r = s.max_code;
  return static_cast<uint8_t>(sign | r);
}

float fp8_decode(uint8_t code, Fp8Format f) {
  if (f == Fp8Format::kHiF8) return hif8_decode(code);
  const Fp8Spec s = spec_of(f);
  const int exp_bits = 7 - s.mant;
  const int e = (code >> s.mant) & ((1 << exp_bits) - 1);
  const int m = code & ((1 << s.mant) - 1);
  const bool negative = (code & 0x80) != 0;
  float v;
  if (f == Fp8Format::kE4M3 && e == 15 && m == 7) {
    v = std::numeric_limits<float>::quiet_NaN();
  } else if (f == Fp8Format::kE5M2 && e == 31) {
    v = m == 0 ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
  } else if (e == 0) {
    v = std::ldexp(static_cast<float>(m), 1 - s.bias - s.mant);
  } else {
    v = std::ldexp(static_cast<float>((1 << s.mant) + m), e - s.bias - s.mant);
  }
  return negative ? -v : v;
}

float round_to_bf16(float x) {
  uint32_t u = bits_of(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return x;  // NaN
  u += 0x7FFFu + ((u >> 16) & 1u);
  return float_of(u & 0xFFFF0000u);
}

int64_t quant_num_blocks(int64_t n, const QuantLayout& l) {
  if (n <= 0) return 0;
  if (n <= l.first) return 1;
  return 1 + (n - l.first + l.block - 1) / l.block;
}

int64_t quant_scale_bytes(QuantMode mode) { return mode == QuantMode::kMx ? 1 : 4; }

void quantise_state_ref(const float* x, int64_t n, const QuantLayout& l, QuantStateRef out) {
  check_layout(l, out);
  std::vector<float> tmp(static_cast<size_t>(std::min(n, l.block)));
  const int64_t blocks = quant_num_blocks(n, l);
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t lo = block_start(b, l), hi = std::min(n, block_start(b + 1, l));
    quantise_block(x + lo, hi - lo, l.mode, out.format, out.target, out.codes + lo, out.scales, b, tmp.data());
  }
}

void dequantise_state_ref(QuantStateRef in, int64_t n, const QuantLayout& l, float* x) {
  check_layout(l, in);
  const int64_t blocks = quant_num_blocks(n, l);
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t lo = block_start(b, l), hi = std::min(n, block_start(b + 1, l));
    dequantise_block(in.codes + lo, hi - lo, l.mode, in.format, in.scales, b, x + lo);
  }
}

void adamw_step_quantised_ref(float* p, const float* g, QuantStateRef m, QuantStateRef v, int64_t n,
                              const QuantLayout& l, const AdamWHyper& h) {
  std::vector<float> mf(static_cast<size_t>(n)), vf(static_cast<size_t>(n));
  dequantise_state_ref(m, n, l, mf.data());
  dequantise_state_ref(v, n, l, vf.data());
  adamw_step_ref(p, g, mf.data(), vf.data(), n, h);
  quantise_state_ref(mf.data(), n, l, m);
  quantise_state_ref(vf.data(), n, l, v);
}

void adamw_step_quantised_isa(Isa isa, float* p, const float* g, QuantStateRef m, QuantStateRef v, int64_t n,
                              const QuantLayout& l, const AdamWHyper& h) {
  check_layout(l, m);
  check_layout(l, v);
  auto fn = isa == Isa::kAvx512 ? adamw_step_quantised_avx512
            : isa == Isa::kAvx2 ? adamw_step_quantised_avx2
                                : adamw_step_quantised_scalar;
  fn(p, g, m, v, n, l, h);
}

void adamw_step_quantised(float* p, const float* g, QuantStateRef m, QuantStateRef v, int64_t n,
                          const QuantLayout& l, const AdamWHyper& h) {
  adamw_step_quantised_isa(detected_isa(), p, g, m, v, n, l, h);
}

void quantise_state_isa(Isa isa, const float* x, int64_t n, const QuantLayout& l, QuantStateRef out) {
  check_layout(l, out);
  auto fn = isa == Isa::kAvx512 ? quantise_state_avx512 : isa == Isa::kAvx2 ? quantise_state_avx2 : quantise_state_scalar;
  fn(x, n, l, out);
}

void dequantise_state_isa(Isa isa, QuantStateRef in, int64_t n, const QuantLayout& l, float* x) {
  check_layout(l, in);
  auto fn = isa == Isa::kAvx512 ? dequantise_state_avx512
            : isa == Isa::kAvx2 ? dequantise_state_avx2
                                : dequantise_state_scalar;
  fn(in, n, l, x);
}

void quantise_state(const float* x, int64_t n, const QuantLayout& l, QuantStateRef out) {
  quantise_state_isa(detected_isa(), x, n, l, out);
}

void dequantise_state(QuantStateRef in, int64_t n, const QuantLayout& l, float* x) {
  dequantise_state_isa(detected_isa(), in, n, l, x);
}

const float* fp8_decode_table(Fp8Format f) { return decode_table(f).data(); }

}  // namespace gale
