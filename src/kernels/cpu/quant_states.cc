// FP8 state codes, block scaling, and the reference and fused AdamW over quantised moments.
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

// Decoding tables, one per format.
const std::array<float, 256>& decode_table(Fp8Format f) {
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
// len floats (kMx: the k-scaled values).
void quantise_block(const float* x, int64_t len, QuantMode mode, Fp8Format format, uint8_t* codes, uint8_t* scales,
                    int64_t b, float* tmp) {
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
  if (mode == QuantMode::kLinear) {
    float scale;
    std::memcpy(&scale, scales + b * 4, sizeof scale);
    const float inv = 1.0f / scale;
    for (int64_t i = 0; i < len; ++i) x[i] = table[codes[i]] * inv;
    return;
  }
  const float scale = fp8::pow2(static_cast<int>(scales[b]) - 127);  // exact, as above
  for (int64_t i = 0; i < len; ++i) x[i] = signed_sqrt(table[codes[i]] * scale);
}

}  // namespace

float fp8_max(Fp8Format f) { return spec_of(f).max; }

uint8_t fp8_encode(float x, Fp8Format f) {
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

int64_t quant_scale_bytes(QuantMode mode) { return mode == QuantMode::kLinear ? 4 : 1; }

void quantise_state_ref(const float* x, int64_t n, const QuantLayout& l, QuantStateRef out) {
  GALE_CHECK(l.block > 0 && l.first > 0 && l.first <= l.block) << "quantisation blocks " << l.first << "/" << l.block;
  std::vector<float> tmp(static_cast<size_t>(std::min(n, l.block)));
  const int64_t blocks = quant_num_blocks(n, l);
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t lo = block_start(b, l), hi = std::min(n, block_start(b + 1, l));
    quantise_block(x + lo, hi - lo, l.mode, out.format, out.codes + lo, out.scales, b, tmp.data());
  }
}

void dequantise_state_ref(QuantStateRef in, int64_t n, const QuantLayout& l, float* x) {
  GALE_CHECK(l.block > 0 && l.first > 0 && l.first <= l.block) << "quantisation blocks " << l.first << "/" << l.block;
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
  GALE_CHECK(l.block > 0 && l.first > 0 && l.first <= l.block) << "quantisation blocks " << l.first << "/" << l.block;
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
  GALE_CHECK(l.block > 0 && l.first > 0 && l.first <= l.block) << "quantisation blocks " << l.first << "/" << l.block;
  auto fn = isa == Isa::kAvx512 ? quantise_state_avx512 : isa == Isa::kAvx2 ? quantise_state_avx2 : quantise_state_scalar;
  fn(x, n, l, out);
}

void dequantise_state_isa(Isa isa, QuantStateRef in, int64_t n, const QuantLayout& l, float* x) {
  GALE_CHECK(l.block > 0 && l.first > 0 && l.first <= l.block) << "quantisation blocks " << l.first << "/" << l.block;
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
