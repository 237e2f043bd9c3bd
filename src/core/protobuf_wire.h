// Hand-encoded protobuf wire format: the few field writers Gale's TensorBoard and W&B writers use.
//
// A field is its key, varint((number << 3) | wire type), then its value: wire type 0 a varint,
// 1 eight little-endian bytes, 2 a varint length then the bytes (strings, bytes, nested messages),
// 5 four little-endian bytes. No protobuf library is involved; callers write fields in number order
// and leave proto3 zero values out.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace gale::pbwire {

// `bytes` little-endian bytes of `v`.
inline void put_le(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// Base-128 varint (int64 values are cast to uint64: ten bytes when negative).
inline void put_varint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

// Field key: (field number << 3) | wire type (0 varint, 1 fixed64, 2 length-delimited, 5 fixed32).
inline void put_key(std::string* out, int field, int wire_type) {
  put_varint(out, (static_cast<uint64_t>(field) << 3) | static_cast<uint64_t>(wire_type));
}

// A length-delimited field (string, bytes or an encoded nested message).
inline void put_bytes(std::string* out, int field, std::string_view bytes) {
  put_key(out, field, 2);
  put_varint(out, bytes.size());
  out->append(bytes);
}

// A varint field (int32, int64, bool, enum).
inline void put_varint_field(std::string* out, int field, uint64_t v) {
  put_key(out, field, 0);
  put_varint(out, v);
}

// A double field (fixed64).
inline void put_double(std::string* out, int field, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, field, 1);
  put_le(out, bits, 8);
}

// A float field (fixed32).
inline void put_float(std::string* out, int field, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, field, 5);
  put_le(out, bits, 4);
}

}  // namespace gale::pbwire
