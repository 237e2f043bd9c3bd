// Read-only views of whole files (a memory map, or a heap copy) and unaligned little-endian loads.
//
// Megatron's .idx arrays start at byte 34, so they are not aligned: every read of a multi-byte
// value from a mapped file goes through `load_unaligned` (memcpy), never a cast pointer.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "core/status.h"

namespace gale {

template <class T>
inline T load_unaligned(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// A little-endian array of T at an arbitrary byte address (a mapped file or a vector's data).
template <class T>
class UnalignedArray {
 public:
  UnalignedArray() = default;
  UnalignedArray(const void* data, int64_t size) : data_(static_cast<const uint8_t*>(data)), size_(size) {}
  T operator[](int64_t i) const { return load_unaligned<T>(data_ + i * static_cast<int64_t>(sizeof(T))); }
  int64_t size() const { return size_; }
  const uint8_t* bytes() const { return data_; }

 private:
  const uint8_t* data_ = nullptr;
  int64_t size_ = 0;
};

class MappedFile {
 public:
  // Maps `path` read-only (`use_mmap`), or reads it into memory. Errors name the file.
  static StatusOr<std::unique_ptr<MappedFile>> open(const std::string& path, bool use_mmap = true);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  int64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  std::string path_;
  const uint8_t* data_ = nullptr;
  int64_t size_ = 0;
  bool mapped_ = false;
  std::unique_ptr<uint8_t[]> heap_;
};

}  // namespace gale
