// Aligned host allocation with atomic byte counters.
#include "core/allocator.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "core/check.h"
#include "core/memory_history.h"

namespace gale {

namespace {
// Whole pages up to 1 MiB; above, a multiple of 1/8 of the power of two at or below the size.
size_t cache_size_class(size_t bytes) {
  const size_t pages = (bytes + Allocator::kPageBytes - 1) / Allocator::kPageBytes * Allocator::kPageBytes;
  if (pages <= (size_t{1} << 20)) return pages;
  const size_t step = std::bit_floor(pages) / 8;
  return (pages + step - 1) / step * step;
}
}  // namespace

void Allocator::raise_max_reserved(int64_t now) {
  int64_t seen = max_reserved_.load(std::memory_order_relaxed);
  while (now > seen && !max_reserved_.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
  }
}

void* Allocator::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  if (bytes >= kCacheMinBytes) {
    const size_t cls = cache_size_class(bytes);
    std::lock_guard<std::mutex> lock(cache_mutex_);
    // The smallest cached block that fits, from a class at most twice this one.
    for (auto it = cache_.lower_bound(cls); it != cache_.end() && it->first <= 2 * cls; ++it) {
      if (it->second.empty()) continue;
      p = it->second.back();
      it->second.pop_back();
      cache_bytes_ -= static_cast<int64_t>(it->first);
      break;
    }
    if (p == nullptr) {
      p = std::aligned_alloc(kPageBytes, cls);
      if (p != nullptr) {
        block_class_[p] = cls;
        raise_max_reserved(reserved_.fetch_add(static_cast<int64_t>(cls), std::memory_order_relaxed) +
                           static_cast<int64_t>(cls));
      }
    }
  } else {
    const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
    p = std::aligned_alloc(kAlignment, rounded);
    if (p != nullptr)
      raise_max_reserved(reserved_.fetch_add(static_cast<int64_t>(rounded), std::memory_order_relaxed) +
                         static_cast<int64_t>(rounded));
  }
  GALE_CHECK(p != nullptr) << "out of host memory allocating " << bytes << " bytes";
  int64_t now = current_.fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed) + static_cast<int64_t>(bytes);
  count_.fetch_add(1, std::memory_order_relaxed);
  live_.fetch_add(1, std::memory_order_relaxed);
  for (std::atomic<int64_t>* high : {&peak_, &window_peak_, &max_live_}) {
    int64_t seen = high->load(std::memory_order_relaxed);
    while (now > seen && !high->compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
    }
  }
  if (MemoryHistory* h = history_.load(std::memory_order_relaxed)) h->on_alloc(p, bytes);
  return p;
}

void Allocator::deallocate(void* ptr, size_t bytes) {
  if (ptr == nullptr) return;
  if (MemoryHistory* h = history_.load(std::memory_order_relaxed)) h->on_free(ptr, bytes);
  current_.fetch_sub(static_cast<int64_t>(bytes), std::memory_order_relaxed);
  live_.fetch_sub(1, std::memory_order_relaxed);
  if (bytes >= kCacheMinBytes) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    auto it = block_class_.find(ptr);
    GALE_CHECK(it != block_class_.end()) << "freeing a block the allocator did not hand out";
    const size_t cls = it->second;  // the block's own class (it may serve a smaller request)
    const int64_t limit = std::min(kCacheLimitBytes, max_live_.load(std::memory_order_relaxed));
    if (cache_bytes_ + static_cast<int64_t>(cls) <= limit) {
      cache_[cls].push_back(ptr);
      cache_bytes_ += static_cast<int64_t>(cls);
      return;
    }
    block_class_.erase(it);
    reserved_.fetch_sub(static_cast<int64_t>(cls), std::memory_order_relaxed);
  } else {
    reserved_.fetch_sub(static_cast<int64_t>((bytes + kAlignment - 1) / kAlignment * kAlignment),
                        std::memory_order_relaxed);
  }
  std::free(ptr);
}

int64_t Allocator::cached_bytes() const {
  std::lock_guard<std::mutex> lock(cache_mutex_);
  return cache_bytes_;
}

void Allocator::release_cache() {
  std::lock_guard<std::mutex> lock(cache_mutex_);
  for (auto& [cls, blocks] : cache_)
    for (void* p : blocks) {
      block_class_.erase(p);
      reserved_.fetch_sub(static_cast<int64_t>(cls), std::memory_order_relaxed);
      std::free(p);
    }
  cache_.clear();
  cache_bytes_ = 0;
}

bool Allocator::set_history(MemoryHistory* history) {
  if (history == nullptr) {
    history_.store(nullptr);
    return true;
  }
  MemoryHistory* none = nullptr;
  return history_.compare_exchange_strong(none, history) || none == history;
}

Allocator& host_allocator() {
  static Allocator* allocator = new Allocator();  // never destroyed: tensors may outlive statics
  return *allocator;
}

namespace {
int64_t read_status_kb(const char* key) {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  int64_t kb = 0;
  size_t n = std::strlen(key);
  while (std::fgets(line, sizeof line, f)) {
    if (std::strncmp(line, key, n) == 0) {
      kb = std::atoll(line + n);
      break;
    }
  }
  std::fclose(f);
  return kb;
}
}  // namespace

int64_t peak_rss_bytes() { return read_status_kb("VmHWM:") * 1024; }
int64_t current_rss_bytes() { return read_status_kb("VmRSS:") * 1024; }

}  // namespace gale
