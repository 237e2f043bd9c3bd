// FP8 state codes, block scaling, and the reference and fused AdamW over quantised moments.
#include "kernels/cpu/quant_states.h"

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/check.h"
#include "core/threads.h"

namespace gale {

namespace {

struct Fp8Spec {
  int mant;          // mantissa bits
  int bias;          // exponent bias
  uint8_t max_code;  // magnitude code of the largest finite value
  float max;
  int emax;  // exponent of the largest normal binade (the OCP MX emax_elem)
};

constexpr Fp8Spec spec_of(Fp8Format f) {
  return f == Fp8Format::kE4M3 ? Fp8Spec{3, 7, 0x7E, 448.0f, 8} : Fp8Spec{2, 15, 0x7B, 57344.0f, 15};
}

inline uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
inline float float_of(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

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
    float scale = 1.0f;  // MindSpeed keeps the previous scale for an all-zero block: the same zeros
    if (amax > 0.0f && std::isfinite(amax)) {
      scale = s.max / amax;
      if (std::isinf(scale)) scale = FLT_MAX;
    }
    for (int64_t i = 0; i < len; ++i) codes[i] = fp8_encode(x[i] * scale, format);
    std::memcpy(scales + b * 4, &scale, sizeof scale);
    return;
  }
  float amax = 0.0f;
  for (int64_t i = 0; i < len; ++i) {
    tmp[i] = round_to_bf16(signed_square(x[i]));
    amax = std::max(amax, std::fabs(tmp[i]));
  }
  int exponent = amax > 0.0f ? std::ilogb(amax) - s.emax : -127;
  exponent = std::clamp(exponent, -127, 127);
  const float inv = std::ldexp(1.0f, -exponent);  // a power of two: the product is ldexp's, exactly
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
  const float scale = std::ldexp(1.0f, static_cast<int>(scales[b]) - 127);  // exact, as above
  for (int64_t i = 0; i < len; ++i) x[i] = signed_sqrt(table[codes[i]] * scale);
}

// adamw_step_ref's update of one element (the same expression, so the same rounding: this file,
// like optimizer.cc, is compiled without FMA contraction).
inline void adamw_element(float& p, float g, float& m, float& v, const AdamWHyper& h, float bc1, float bc2) {
  const float gi = g * h.grad_scale;
  m = h.beta1 * m + (1.0f - h.beta1) * gi;
  v = h.beta2 * v + (1.0f - h.beta2) * gi * gi;
  float update = (m / bc1) / (std::sqrt(v / bc2) + h.eps) + h.weight_decay * p;
  p -= h.lr * update;
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
  const float min_normal = std::ldexp(1.0f, 1 - s.bias);
  if (a < min_normal) {  // the subnormal grid: multiples of 2^(1 − bias − mant); may round up to min_normal
    const float q = std::nearbyint(std::ldexp(a, s.bias - 1 + s.mant));
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

void adamw_step_quantised(float* p, const float* g, QuantStateRef m, QuantStateRef v, int64_t n,
                          const QuantLayout& l, const AdamWHyper& h) {
  GALE_CHECK(l.block > 0 && l.first > 0 && l.first <= l.block) << "quantisation blocks " << l.first << "/" << l.block;
  const float bc1 = 1.0f - std::pow(h.beta1, static_cast<float>(h.step));
  const float bc2 = 1.0f - std::pow(h.beta2, static_cast<float>(h.step));
  const int64_t blocks = quant_num_blocks(n, l);
  const int64_t longest = std::min(n, l.block);
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(1, longest));
  parallel_for(blocks, grain, [&](int64_t b0, int64_t b1) {
    std::vector<float> buf(static_cast<size_t>(3 * longest));
    float* mb = buf.data();
    float* vb = mb + longest;
    float* tmp = vb + longest;
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t lo = block_start(b, l), len = std::min(n, block_start(b + 1, l)) - lo;
      dequantise_block(m.codes + lo, len, l.mode, m.format, m.scales, b, mb);
      dequantise_block(v.codes + lo, len, l.mode, v.format, v.scales, b, vb);
      for (int64_t i = 0; i < len; ++i) adamw_element(p[lo + i], g[lo + i], mb[i], vb[i], h, bc1, bc2);
      quantise_block(mb, len, l.mode, m.format, m.codes + lo, m.scales, b, tmp);
      quantise_block(vb, len, l.mode, v.format, v.codes + lo, v.scales, b, tmp);
    }
  });
}

}  // namespace gale
