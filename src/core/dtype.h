// Element types of tensors (f32, bf16 and the integer types of datasets) and bf16 conversion.
#pragma once

#include <cstdint>
#include <cstring>

namespace gale {

enum class DType : uint8_t { kF32, kBF16, kI32, kI64, kU16, kU8, kF64 };

constexpr int dtype_size(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kBF16: return 2;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kU16: return 2;
    case DType::kU8: return 1;
    case DType::kF64: return 8;
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

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::kF32; }
template <> constexpr DType dtype_of<bf16>() { return DType::kBF16; }
template <> constexpr DType dtype_of<int32_t>() { return DType::kI32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::kI64; }
template <> constexpr DType dtype_of<uint16_t>() { return DType::kU16; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::kU8; }
template <> constexpr DType dtype_of<double>() { return DType::kF64; }

}  // namespace gale
