// Aligned host allocation with atomic byte counters.
#include "core/allocator.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "core/check.h"

namespace gale {

namespace {
size_t cache_size_class(size_t bytes) {
  return (bytes + Allocator::kPageBytes - 1) / Allocator::kPageBytes * Allocator::kPageBytes;
}
}  // namespace

void* Allocator::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  if (bytes >= kCacheMinBytes) {
    const size_t cls = cache_size_class(bytes);
    {
      std::lock_guard<std::mutex> lock(cache_mutex_);
      auto it = cache_.find(cls);
      if (it != cache_.end() && !it->second.empty()) {
        p = it->second.back();
        it->second.pop_back();
        cache_bytes_ -= static_cast<int64_t>(cls);
      }
    }
    if (p == nullptr) p = std::aligned_alloc(kPageBytes, cls);
  } else {
    p = std::aligned_alloc(kAlignment, (bytes + kAlignment - 1) / kAlignment * kAlignment);
  }
  GALE_CHECK(p != nullptr) << "out of host memory allocating " << bytes << " bytes";
  int64_t now = current_.fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed) + static_cast<int64_t>(bytes);
  count_.fetch_add(1, std::memory_order_relaxed);
  int64_t peak = peak_.load(std::memory_order_relaxed);
  while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
  return p;
}

void Allocator::deallocate(void* ptr, size_t bytes) {
  if (ptr == nullptr) return;
  current_.fetch_sub(static_cast<int64_t>(bytes), std::memory_order_relaxed);
  if (bytes >= kCacheMinBytes) {
    const size_t cls = cache_size_class(bytes);
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_bytes_ + static_cast<int64_t>(cls) <= kCacheLimitBytes) {
      cache_[cls].push_back(ptr);
      cache_bytes_ += static_cast<int64_t>(cls);
      return;
    }
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
    for (void* p : blocks) std::free(p);
  cache_.clear();
  cache_bytes_ = 0;
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
