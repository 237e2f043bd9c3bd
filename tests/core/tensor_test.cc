// Tensor shapes, views, slices and the allocator's exact byte accounting.
#include "core/tensor.h"

#include <gtest/gtest.h>

#include "core/allocator.h"
#include "core/threads.h"

namespace gale {
namespace {

TEST(Tensor, EmptyHasShapeAndBytes) {
  Tensor t = Tensor::empty({4, 2, 8});
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.ndim(), 3);
  EXPECT_EQ(t.numel(), 64);
  EXPECT_EQ(t.nbytes(), 256u);
  EXPECT_EQ(t.size(-1), 8);
  EXPECT_EQ(t.shape_string(), "[4, 2, 8]");
  Tensor b = Tensor::zeros({3}, DType::kBF16);
  EXPECT_EQ(b.nbytes(), 6u);
  EXPECT_EQ(bf16_to_float(b.data<bf16>()[2]), 0.0f);
}

TEST(Tensor, ViewAndSliceShareStorage) {
  Tensor t = Tensor::zeros({4, 3});
  Tensor v = t.view({2, -1});
  EXPECT_EQ(v.size(1), 6);
  Tensor s = t.slice(2, 2);
  s.fill(5.0f);
  EXPECT_EQ(t.data<float>()[5], 0.0f);
  EXPECT_EQ(t.data<float>()[6], 5.0f);
  EXPECT_EQ(v.data<float>()[11], 5.0f);
}

TEST(Tensor, ZeroClearsExactlyItsOwnBytesOnAnyThreadCount) {
  const int saved = num_threads();
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    // A slice of 1,234,567 floats (4.9 MB: split over the threads, not a multiple of the block) in
    // the middle of a larger buffer: everything in it becomes 0, its neighbours keep their value.
    Tensor t = Tensor::empty({1234567 + 2});
    t.fill(3.0f);
    t.slice(1, 1234567).zero();
    const float* p = t.data<float>();
    EXPECT_EQ(p[0], 3.0f);
    EXPECT_EQ(p[1234567 + 1], 3.0f);
    int64_t nonzero = 0;
    for (int64_t i = 1; i <= 1234567; ++i) nonzero += p[i] != 0.0f;
    EXPECT_EQ(nonzero, 0) << threads << " threads";
  }
  set_num_threads(saved);
}

TEST(Tensor, StreamingZeroClearsExactlyItsOwnBytes) {
  // Past kStreamingZeroBytes (non-temporal stores), starting 4 bytes past a 16-byte boundary and
  // ending mid-line: the unaligned head and tail are cleared too, the neighbours are not.
  const int64_t n = kStreamingZeroBytes / 4 + 1001;
  const int saved = num_threads();
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    Tensor t = Tensor::empty({n + 2});
    t.fill(5.0f);
    t.slice(1, n).zero();
    const float* p = t.data<float>();
    EXPECT_EQ(p[0], 5.0f);
    EXPECT_EQ(p[n + 1], 5.0f);
    int64_t nonzero = 0;
    for (int64_t i = 1; i <= n; ++i) nonzero += p[i] != 0.0f;
    EXPECT_EQ(nonzero, 0) << threads << " threads";
  }
  set_num_threads(saved);
}

TEST(Tensor, CloneIsDeep) {
  Tensor t = Tensor::zeros({2});
  Tensor c = t.clone();
  c.fill(1.0f);
  EXPECT_EQ(t.data<float>()[0], 0.0f);
}

TEST(Allocator, CountsExactBytesAndPeak) {
  Allocator& a = host_allocator();
  int64_t before = a.current_bytes();
  a.reset_peak();
  {
    Tensor x = Tensor::empty({1000});
    EXPECT_EQ(a.current_bytes() - before, 4000);
    {
      Tensor y = Tensor::empty({10}, DType::kBF16);
      EXPECT_EQ(a.current_bytes() - before, 4020);
    }
    EXPECT_EQ(a.current_bytes() - before, 4000);
  }
  EXPECT_EQ(a.current_bytes(), before);
  EXPECT_EQ(a.peak_bytes() - before, 4020);
}

TEST(Allocator, CountsLiveAllocationsAndReservedBytes) {
  Allocator& a = host_allocator();
  a.release_cache();
  const int64_t live = a.live_allocations(), reserved = a.reserved_bytes();
  {
    Tensor small = Tensor::empty({10});  // 40 bytes: one 64-byte line
    EXPECT_EQ(a.live_allocations() - live, 1);
    EXPECT_EQ(a.reserved_bytes() - reserved, 64);
    {
      Tensor big = Tensor::empty({(1 << 18) + 1});  // 1 MiB + 4 bytes: the size class 1 MiB + 128 KiB
      EXPECT_EQ(a.live_allocations() - live, 2);
      EXPECT_EQ(a.reserved_bytes() - reserved, 64 + (1 << 20) + (1 << 17));
    }
    EXPECT_EQ(a.live_allocations() - live, 1);
    // The freed large block stays reserved in the cache until the cache is released.
    EXPECT_EQ(a.reserved_bytes() - reserved, 64 + a.cached_bytes());
    a.release_cache();
    EXPECT_EQ(a.reserved_bytes() - reserved, 64);
  }
  EXPECT_EQ(a.live_allocations(), live);
  EXPECT_EQ(a.reserved_bytes(), reserved);
}

TEST(BF16, RoundToNearestEven) {
  // 1 + 2^-8 is exactly halfway between two bf16 values: rounds to even (1.0).
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 1.0f / 256.0f)), 1.0f);
  // 1 + 3*2^-8 rounds up to 1 + 2^-6.
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 3.0f / 256.0f)), 1.0f + 1.0f / 64.0f);
  EXPECT_EQ(bf16_to_float(float_to_bf16(-2.5f)), -2.5f);
}

}  // namespace
}  // namespace gale

namespace gale {
namespace {

TEST(Allocator, LargeBlocksAreReusedFromTheCache) {
  Allocator& a = host_allocator();
  a.release_cache();
  void* first;
  {
    Tensor big = Tensor::empty({1 << 18});  // 1 MiB
    first = big.raw();
    EXPECT_EQ(a.cached_bytes(), 0);
  }
  EXPECT_EQ(a.cached_bytes(), 1 << 20);  // freed into the cache, not to the system
  int64_t live = a.current_bytes();
  {
    Tensor again = Tensor::empty({1 << 18});
    EXPECT_EQ(again.raw(), first);  // the same pages
    EXPECT_EQ(a.cached_bytes(), 0);
    EXPECT_EQ(a.current_bytes() - live, 1 << 20);  // accounting counts live bytes only
  }
  a.release_cache();
  EXPECT_EQ(a.cached_bytes(), 0);
}

// Sizes that change from step to step (--variable-seq-lengths) reuse larger cached blocks, up to
// twice their size class, smallest first; above 1 MiB the classes are 8 per power of two.
TEST(Allocator, ASmallerRequestReusesTheSmallestLargerBlockWithinTwiceItsSize) {
  Allocator& a = host_allocator();
  a.release_cache();
  void *three, *five;
  {
    Tensor t3 = Tensor::empty({3 << 18});  // 3 MiB
    Tensor t5 = Tensor::empty({5 << 18});  // 5 MiB
    three = t3.raw();
    five = t5.raw();
  }
  EXPECT_EQ(a.cached_bytes(), 8 << 20);
  {
    Tensor t = Tensor::empty({(3 << 18) - 1000});  // 3 MiB less a little: the same class
    EXPECT_EQ(t.raw(), three);
    Tensor u = Tensor::empty({(2 << 18) + 1000});  // just above 2 MiB: class 2.25 MiB; 5 MiB > 2x, fresh
    EXPECT_NE(u.raw(), five);
    EXPECT_EQ(a.cached_bytes(), 5 << 20);
    Tensor v = Tensor::empty({(3 << 18) + 1000});  // class 3.5 MiB: takes the 5 MiB block
    EXPECT_EQ(v.raw(), five);
    EXPECT_EQ(a.cached_bytes(), 0);
  }
  // Freed, each block goes back to its own class: the 5 MiB block serves a 5 MiB request again.
  {
    Tensor w = Tensor::empty({5 << 18});
    EXPECT_EQ(w.raw(), five);
  }
  a.release_cache();
  EXPECT_EQ(a.cached_bytes(), 0);
}

}  // namespace
}  // namespace gale
