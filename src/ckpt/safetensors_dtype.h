// The element types of the safetensors format ("F32", "BF16", ...) and conversions to Gale dtypes.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "core/dtype.h"
#include "core/status.h"

namespace gale {

// Declared in the format's alignment order (the Python package's enum order): its writer lays
// tensors out by this order descending, then by name, and so does Gale's.
enum class StDType : uint8_t {
  kBool,
  kU8,
  kI8,
  kF8E5M2,
  kF8E4M3,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kF64,
  kI64,
  kU64
};

const char* st_dtype_name(StDType t);  // "F32", "BF16", "BOOL", ...
int st_dtype_size(StDType t);          // bytes per element
std::optional<StDType> st_dtype_from_name(std::string_view name);
bool st_dtype_is_float(StDType t);

// The safetensors dtype that stores a Gale tensor dtype exactly (f32 -> F32, bf16 -> BF16, ...).
StDType st_dtype_of(DType t);
// The Gale dtype that holds a safetensors dtype without conversion (BOOL -> u8), if there is one.
std::optional<DType> gale_dtype_of(StDType t);

// IEEE half -> float (exact, including subnormals, infinities and NaN).
float half_to_float(uint16_t h);

// Convert `n` little-endian elements of `from` at `src` into `n` elements of Gale dtype `to`.
// Floating types (F64, F32, F16, BF16) convert to f32, bf16 and f64 (bf16 rounds to nearest even);
// integer types (and BOOL) convert to i64, i32, u16 and u8, failing with OutOfRange when a value
// does not fit. Anything else (e.g. float -> int, F8) is Unimplemented. `what` names the tensor
// in error messages.
Status convert_elements(StDType from, const void* src, DType to, void* dst, int64_t n, std::string_view what);

}  // namespace gale
