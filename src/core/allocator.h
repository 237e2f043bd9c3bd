// Host memory allocator with exact byte accounting (current and peak), used for memory reports.
//
// Every tensor's storage comes from here, so `current_bytes()` is exactly the bytes of live
// tensors and `peak_bytes()` the high-water mark since the last `reset_peak()`. Allocations are
// 64-byte aligned (one cache line; full AVX-512 vector).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace gale {

class Allocator {
 public:
  static constexpr size_t kAlignment = 64;

  void* allocate(size_t bytes);
  void deallocate(void* ptr, size_t bytes);

  int64_t current_bytes() const { return current_.load(std::memory_order_relaxed); }
  int64_t peak_bytes() const { return peak_.load(std::memory_order_relaxed); }
  int64_t num_allocations() const { return count_.load(std::memory_order_relaxed); }
  void reset_peak() { peak_.store(current_bytes(), std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> current_{0};
  std::atomic<int64_t> peak_{0};
  std::atomic<int64_t> count_{0};
};

// The process-wide host allocator (memory accounting is per process by nature).
Allocator& host_allocator();

// Peak resident set size of this process in bytes (VmHWM), for reports beside the allocator's.
int64_t peak_rss_bytes();
int64_t current_rss_bytes();

}  // namespace gale
