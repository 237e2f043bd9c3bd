// Aligned, uninitialised scratch memory for kernels, counted by the host allocator.
//
// Kernels in ISA-specific files (*_avx2.cc, *_avx512.cc) take their temporary buffers from here
// instead of std::vector (see the rule in kernels/cpu/isa.h); the memory shows in the allocator's
// byte counters, so peak-memory reports include kernel workspaces.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gale {

class ScratchBuffer {
 public:
  ScratchBuffer() = default;
  explicit ScratchBuffer(size_t bytes);
  ~ScratchBuffer();
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;

  // Drops the old contents; keeps the memory when it is already large enough.
  void reserve(size_t bytes);
  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  float* floats() const { return static_cast<float*>(data_); }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace gale
