// Host memory allocator with exact byte accounting (current and peak), used for memory reports,
// and a cache of freed large blocks so that a training step's activations reuse last step's pages.
//
// Every tensor's storage comes from here, so `current_bytes()` is exactly the bytes of live
// tensors and `peak_bytes()` the high-water mark since the last `reset_peak()`. Allocations are
// 64-byte aligned (one cache line; full AVX-512 vector).
//
// Blocks of at least kCacheMinBytes are rounded up to a size class and, when freed, kept in a free
// list per class instead of being returned to the system: the next allocation takes the smallest
// cached block of its class or of a class up to twice as large (each training step allocates the
// same activation sizes, and fresh pages cost a page fault each — about 7% of a step; with
// --variable-seq-lengths the sizes change from micro-batch to micro-batch, and a shorter one
// reuses a longer one's blocks). Classes: whole pages up to 1 MiB, then 8 per power of two (a
// block is at most 12.5% larger than asked; pages never written are never resident).
// `cached_bytes()` reports what the cache holds; `release_cache()` returns it. The cache never
// holds more than the largest number of live bytes seen (so the process holds at most twice its
// working set) nor more than kCacheLimitBytes; a block freed beyond that goes back to the system.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace gale {

class MemoryHistory;

class Allocator {
 public:
  static constexpr size_t kAlignment = 64;
  static constexpr size_t kCacheMinBytes = size_t{1} << 16;  // 64 KiB
  static constexpr size_t kPageBytes = 4096;
  static constexpr int64_t kCacheLimitBytes = int64_t{8} << 30;

  void* allocate(size_t bytes);
  void deallocate(void* ptr, size_t bytes);

  int64_t current_bytes() const { return current_.load(std::memory_order_relaxed); }
  int64_t peak_bytes() const { return peak_.load(std::memory_order_relaxed); }
  int64_t num_allocations() const { return count_.load(std::memory_order_relaxed); }  // ever made
  int64_t live_allocations() const { return live_.load(std::memory_order_relaxed); }   // not yet freed
  // Bytes this allocator holds from the system: every live block at its allocated size (64-byte
  // multiple, or the size class of a large block) plus the free-block cache.
  int64_t reserved_bytes() const { return reserved_.load(std::memory_order_relaxed); }
  // The highest reserved_bytes() and current_bytes() since the process started (reset_peak()
  // leaves both): torch.cuda's max_memory_reserved / max_memory_allocated in Megatron's report.
  int64_t max_reserved_bytes() const { return max_reserved_.load(std::memory_order_relaxed); }
  int64_t max_live_bytes() const { return max_live_.load(std::memory_order_relaxed); }
  void reset_peak() { peak_.store(current_bytes(), std::memory_order_relaxed); }
  // A second high-water mark, independent of peak_bytes(): what --smart-swap's sampling
  // (model/smart_swap.h) reads between two points of an iteration without disturbing a caller's
  // reset_peak() / peak_bytes() around the whole run.
  int64_t window_peak_bytes() const { return window_peak_.load(std::memory_order_relaxed); }
  void reset_window_peak() { window_peak_.store(current_bytes(), std::memory_order_relaxed); }
  int64_t cached_bytes() const;
  void release_cache();
  // --record-memory-history (core/memory_history.h): the history told of every allocate and
  // deallocate, or none (null). set_history(h) with h non-null fails (false) while another is set.
  bool set_history(MemoryHistory* history);
  MemoryHistory* history() const { return history_.load(std::memory_order_relaxed); }

 private:
  void raise_max_reserved(int64_t now);

  std::atomic<MemoryHistory*> history_{nullptr};
  std::atomic<int64_t> current_{0};
  std::atomic<int64_t> peak_{0};
  std::atomic<int64_t> window_peak_{0};
  std::atomic<int64_t> count_{0};
  std::atomic<int64_t> live_{0};
  std::atomic<int64_t> reserved_{0};
  std::atomic<int64_t> max_live_{0};  // the highest current_bytes() ever (reset_peak leaves it)
  std::atomic<int64_t> max_reserved_{0};  // the highest reserved_bytes() ever
  mutable std::mutex cache_mutex_;
  std::map<size_t, std::vector<void*>> cache_;  // size class -> free blocks of that class
  std::unordered_map<void*, size_t> block_class_;  // every live or cached block of the cache's sizes
  int64_t cache_bytes_ = 0;
};

// The process-wide host allocator (memory accounting is per process by nature).
Allocator& host_allocator();

// Peak resident set size of this process in bytes (VmHWM), for reports beside the allocator's.
int64_t peak_rss_bytes();
int64_t current_rss_bytes();

}  // namespace gale
