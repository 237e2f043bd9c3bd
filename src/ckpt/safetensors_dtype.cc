// Safetensors dtype names, sizes and element conversions.
#include "ckpt/safetensors_dtype.h"

#include <bit>
#include <cstring>
#include <limits>

namespace gale {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian; Gale reads it in place");

namespace {

struct StDTypeInfo {
  StDType type;
  const char* name;
  int size;
  bool is_float;
};

constexpr StDTypeInfo kInfo[] = {
    {StDType::kBool, "BOOL", 1, false},     {StDType::kU8, "U8", 1, false},         {StDType::kI8, "I8", 1, false},
    {StDType::kF8E5M2, "F8_E5M2", 1, true}, {StDType::kF8E4M3, "F8_E4M3", 1, true}, {StDType::kI16, "I16", 2, false},
    {StDType::kU16, "U16", 2, false},       {StDType::kF16, "F16", 2, true},        {StDType::kBF16, "BF16", 2, true},
    {StDType::kI32, "I32", 4, false},       {StDType::kU32, "U32", 4, false},       {StDType::kF32, "F32", 4, true},
    {StDType::kF64, "F64", 8, true},        {StDType::kI64, "I64", 8, false},       {StDType::kU64, "U64", 8, false},
};

const StDTypeInfo& info(StDType t) { return kInfo[static_cast<int>(t)]; }

template <class T>
T load(const void* src, int64_t i) {
  T v;
  std::memcpy(&v, static_cast<const char*>(src) + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
  return v;
}

double load_float(StDType from, const void* src, int64_t i) {
  switch (from) {
    case StDType::kF64:
      return load<double>(src, i);
    case StDType::kF32:
      return load<float>(src, i);
    case StDType::kF16:
      return half_to_float(load<uint16_t>(src, i));
    case StDType::kBF16:
      return bf16_to_float(bf16{load<uint16_t>(src, i)});
    default:
      return 0.0;
  }
}

// Integers are widened through int64 (U64 values above INT64_MAX are flagged by `overflow`).
int64_t load_int(StDType from, const void* src, int64_t i, bool* overflow) {
  switch (from) {
    case StDType::kBool:
      return load<uint8_t>(src, i) != 0;
    case StDType::kU8:
      return load<uint8_t>(src, i);
    case StDType::kI8:
      return load<int8_t>(src, i);
    case StDType::kI16:
      return load<int16_t>(src, i);
    case StDType::kU16:
      return load<uint16_t>(src, i);
    case StDType::kI32:
      return load<int32_t>(src, i);
    case StDType::kU32:
      return load<uint32_t>(src, i);
    case StDType::kI64:
      return load<int64_t>(src, i);
    case StDType::kU64: {
      uint64_t v = load<uint64_t>(src, i);
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) *overflow = true;
      return static_cast<int64_t>(v);
    }
    default:
      return 0;
  }
}

template <class T>
bool store_int(int64_t v, void* dst, int64_t i) {
  if (v < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
      v > static_cast<int64_t>(std::numeric_limits<T>::max()))
    return false;
  static_cast<T*>(dst)[i] = static_cast<T>(v);
  return true;
}

}  // namespace

const char* st_dtype_name(StDType t) { return info(t).name; }
int st_dtype_size(StDType t) { return info(t).size; }
bool st_dtype_is_float(StDType t) { return info(t).is_float; }

std::optional<StDType> st_dtype_from_name(std::string_view name) {
  for (const StDTypeInfo& i : kInfo)
    if (name == i.name) return i.type;
  return std::nullopt;
}

StDType st_dtype_of(DType t) {
  switch (t) {
    case DType::kF32:
      return StDType::kF32;
    case DType::kBF16:
      return StDType::kBF16;
    case DType::kI32:
      return StDType::kI32;
    case DType::kI64:
      return StDType::kI64;
    case DType::kU16:
      return StDType::kU16;
    case DType::kU8:
      return StDType::kU8;
    case DType::kF64:
      return StDType::kF64;
    case DType::kF16:
      return StDType::kF16;
  }
  return StDType::kU8;
}

std::optional<DType> gale_dtype_of(StDType t) {
  switch (t) {
    case StDType::kF32:
      return DType::kF32;
    case StDType::kBF16:
      return DType::kBF16;
    case StDType::kF64:
      return DType::kF64;
    case StDType::kF16:
      return DType::kF16;
    case StDType::kI32:
      return DType::kI32;
    case StDType::kI64:
      return DType::kI64;
    case StDType::kU16:
      return DType::kU16;
    case StDType::kU8:
      return DType::kU8;
    case StDType::kBool:
      return DType::kU8;
    default:
      return std::nullopt;
  }
}

float half_to_float(uint16_t h) { return f16_to_float(f16{h}); }

Status convert_elements(StDType from, const void* src, DType to, void* dst, int64_t n, std::string_view what) {
  if (gale_dtype_of(from) == to && from != StDType::kBool) {
    std::memcpy(dst, src, static_cast<size_t>(n) * dtype_size(to));
    return Status::Ok();
  }
  bool float_source = st_dtype_is_float(from) && from != StDType::kF8E4M3 && from != StDType::kF8E5M2;
  bool int_source = !st_dtype_is_float(from);
  if (float_source && (to == DType::kF32 || to == DType::kBF16 || to == DType::kF64)) {
    for (int64_t i = 0; i < n; ++i) {
      double v = load_float(from, src, i);
      if (to == DType::kF32)
        static_cast<float*>(dst)[i] = static_cast<float>(v);
      else if (to == DType::kF64)
        static_cast<double*>(dst)[i] = v;
      else
        static_cast<bf16*>(dst)[i] = float_to_bf16(static_cast<float>(v));
    }
    return Status::Ok();
  }
  if (int_source && (to == DType::kI64 || to == DType::kI32 || to == DType::kU16 || to == DType::kU8)) {
    for (int64_t i = 0; i < n; ++i) {
      bool overflow = false;
      int64_t v = load_int(from, src, i, &overflow);
      bool fits = !overflow;
      if (fits) {
        switch (to) {
          case DType::kI64:
            static_cast<int64_t*>(dst)[i] = v;
            break;
          case DType::kI32:
            fits = store_int<int32_t>(v, dst, i);
            break;
          case DType::kU16:
            fits = store_int<uint16_t>(v, dst, i);
            break;
          default:
            fits = store_int<uint8_t>(v, dst, i);
            break;
        }
      }
      if (!fits)
        return OutOfRange(what, ": element ", i, " of the ", st_dtype_name(from), " data does not fit in ",
                          dtype_name(to));
    }
    return Status::Ok();
  }
  return Unimplemented(what, ": cannot convert ", st_dtype_name(from), " data to a ", dtype_name(to), " tensor");
}

}  // namespace gale
