// Element types of tensors (f32, bf16, f16 and the integer types of datasets) and their scalar
// conversions.
#pragma once

#include <cstdint>
#include <cstring>

namespace gale {

enum class DType : uint8_t { kF32, kBF16, kI32, kI64, kU16, kU8, kF64, kF16 };

constexpr int dtype_size(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kBF16: return 2;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kU16: return 2;
    case DType::kU8: return 1;
    case DType::kF64: return 8;
    case DType::kF16: return 2;
  }
  return 0;
}

const char* dtype_name(DType t);  // "f32", "bf16", ...

// bfloat16 storage: the high 16 bits of an IEEE float32.
struct bf16 {
  uint16_t bits = 0;
};

// float -> bf16 with round-to-nearest-even; NaN stays NaN (quiet).
inline bf16 float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  bf16 out;
  if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN
    out.bits = static_cast<uint16_t>((u >> 16) | 0x0040u);
    return out;
  }
  uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  out.bits = static_cast<uint16_t>((u + rounding_bias) >> 16);
  return out;
}

inline float bf16_to_float(bf16 b) {
  uint32_t u = static_cast<uint32_t>(b.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// IEEE 754 binary16 (half) storage: 1 sign, 5 exponent, 10 mantissa bits; largest finite 65504.
struct f16 {
  uint16_t bits = 0;
};

// float -> f16 with round-to-nearest-even, as the F16C instruction vcvtps2ph in that mode: values
// from 65520 up become infinity (the overflow that --fp16's loss scaling detects), values below
// 2^-14 become subnormal (or zero), NaN stays NaN (quiet, top payload bits kept).
inline f16 float_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  f16 out;
  if (a > 0x7f800000u) {  // NaN
    out.bits = static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  } else if (a >= 0x477ff000u) {  // >= 65520 (halfway above 65504, ties to even): infinity
    out.bits = static_cast<uint16_t>(sign | 0x7c00u);
  } else if (a >= 0x38800000u) {  // normal half (>= 2^-14): rebias the exponent, round the mantissa
    const uint32_t rounded = a + 0xfffu + ((a >> 13) & 1u);
    out.bits = static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
  } else {  // subnormal half: 0.5f's unit in the last place is 2^-24, the half subnormal step,
    // so the float addition rounds |f| to that step (to nearest even); 0x400 is 2^-14, the
    // smallest normal, which is right too.
    float magnitude;
    std::memcpy(&magnitude, &a, 4);
    const float sum = magnitude + 0.5f;
    uint32_t s;
    std::memcpy(&s, &sum, 4);
    out.bits = static_cast<uint16_t>(sign | (s - 0x3f000000u));
  }
  return out;
}

// f16 -> float, exact (subnormals, infinities and NaN included).
inline float f16_to_float(f16 h) {
  const uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000u) << 16;
  const uint32_t exponent = (h.bits >> 10) & 0x1fu, mantissa = h.bits & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1f) {  // inf / NaN
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {  // normal
    bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  } else {  // zero or subnormal: mantissa · 2^-24, exact in float
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    std::memcpy(&bits, &magnitude, 4);
    bits |= sign;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::kF32; }
template <> constexpr DType dtype_of<bf16>() { return DType::kBF16; }
template <> constexpr DType dtype_of<f16>() { return DType::kF16; }
template <> constexpr DType dtype_of<int32_t>() { return DType::kI32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::kI64; }
template <> constexpr DType dtype_of<uint16_t>() { return DType::kU16; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::kU8; }
template <> constexpr DType dtype_of<double>() { return DType::kF64; }

}  // namespace gale
