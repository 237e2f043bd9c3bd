// Gradient bucket planning (Megatron's param_and_grad_buffer rules) and the distributed
// optimizer's shard ranges.
#include "optim/grad_buckets.h"

#include <gtest/gtest.h>

namespace gale {
namespace {

// A buffer of parameters with the given element counts (1-D), in registration (forward) order.
ParamBuffer buffer_of(const std::vector<int64_t>& sizes) {
  ParamBuffer pb;
  for (size_t i = 0; i < sizes.size(); ++i) {
    ParamSpec s;
    s.name = "p" + std::to_string(i);
    s.global_shape = {sizes[i]};
    pb.add(s);
  }
  pb.finalize();
  return pb;
}

TEST(GradBuckets, MegatronDefaultSizeAndWhenBucketingIsOn) {
  EXPECT_EQ(default_bucket_size(1), 40000000);
  EXPECT_EQ(default_bucket_size(40), 40000000);
  EXPECT_EQ(default_bucket_size(64), 64000000);
  EXPECT_EQ(chunk_bucket_size(/*overlap=*/true, /*pp_rank=*/0, /*chunk=*/0, 8), 40000000);
  EXPECT_EQ(chunk_bucket_size(false, 0, 0, 8), 0);           // no overlap: one bucket
  EXPECT_EQ(chunk_bucket_size(true, 1, 0, 8), 0);            // later pipeline stages: one bucket
  EXPECT_EQ(chunk_bucket_size(true, 0, 1, 8), 0);            // later virtual chunks: one bucket
  EXPECT_EQ(chunk_bucket_size(false, 2, 3, 8, 1234), 1234);  // the test override wins
  // --ddp-bucket-size / --ddp-num-buckets take the default's place, under the same rule.
  EXPECT_EQ(chunk_bucket_size(true, 0, 0, 8, 0, 5000), 5000);
  EXPECT_EQ(chunk_bucket_size(false, 0, 0, 8, 0, 5000), 0);
  EXPECT_EQ(chunk_bucket_size(true, 1, 0, 8, 0, 5000), 0);
  EXPECT_EQ(chunk_bucket_size(true, 0, 1, 8, 0, 5000), 0);
}

TEST(GradBuckets, OneBucketWhenUnbounded) {
  ParamBuffer pb = buffer_of({10, 20, 30});
  auto buckets = plan_grad_buckets(pb, {0, 4, {}});
  ASSERT_EQ(buckets.size(), 1u);
  EXPECT_EQ(buckets[0].range, (FlatRange{0, 60}));
  EXPECT_EQ(buckets[0].param_ids, (std::vector<int>{2, 1, 0}));
  EXPECT_EQ(buckets[0].padded_numel, 60);
}

TEST(GradBuckets, BackwardOrderClosingAtParameterBoundaries) {
  // Offsets: p0 [0,10) p1 [10,30) p2 [30,60) p3 [60,65) p4 [65,100).
  ParamBuffer pb = buffer_of({10, 20, 30, 5, 35});
  auto buckets = plan_grad_buckets(pb, {40, 3, {}});
  // From the end: p4 (35) < 40, + p3 -> 40 >= 40 closes; p2 + p1 = 50 closes; p0 alone.
  ASSERT_EQ(buckets.size(), 3u);
  EXPECT_EQ(buckets[0].range, (FlatRange{60, 100}));
  EXPECT_EQ(buckets[0].param_ids, (std::vector<int>{4, 3}));
  EXPECT_EQ(buckets[1].range, (FlatRange{10, 60}));
  EXPECT_EQ(buckets[1].param_ids, (std::vector<int>{2, 1}));
  EXPECT_EQ(buckets[2].range, (FlatRange{0, 10}));
  EXPECT_EQ(buckets[2].param_ids, (std::vector<int>{0}));
  // Padded to multiples of dp = 3.
  EXPECT_EQ(buckets[0].padded_numel, 42);
  EXPECT_EQ(buckets[1].padded_numel, 51);
  EXPECT_EQ(buckets[2].padded_numel, 12);
}

TEST(GradBuckets, SeparateParameterGetsItsOwnBucket) {
  // The shared embedding at offset 0 (first stage) and at the end (last stage's copy).
  ParamBuffer pb = buffer_of({16, 4, 4, 4});
  auto first = plan_grad_buckets(pb, {0, 2, {0}});
  ASSERT_EQ(first.size(), 2u);
  EXPECT_EQ(first[0].range, (FlatRange{16, 28}));
  EXPECT_EQ(first[1].range, (FlatRange{0, 16}));
  EXPECT_EQ(first[1].param_ids, (std::vector<int>{0}));
  auto last = plan_grad_buckets(pb, {0, 2, {3}});
  ASSERT_EQ(last.size(), 2u);
  EXPECT_EQ(last[0].range, (FlatRange{24, 28}));
  EXPECT_EQ(last[0].param_ids, (std::vector<int>{3}));
  EXPECT_EQ(last[1].range, (FlatRange{0, 24}));
  auto middle = plan_grad_buckets(pb, {0, 2, {1}});
  ASSERT_EQ(middle.size(), 3u);
  EXPECT_EQ(middle[0].range, (FlatRange{20, 28}));
  EXPECT_EQ(middle[1].range, (FlatRange{16, 20}));
  EXPECT_EQ(middle[2].range, (FlatRange{0, 16}));
}

TEST(GradBuckets, BucketsTileTheBufferForAnySize) {
  ParamBuffer pb = buffer_of({7, 1, 13, 2, 2, 9, 31, 4, 1, 17});
  for (int64_t size : {1, 2, 5, 10, 16, 40, 1000}) {
    auto buckets = plan_grad_buckets(pb, {size, 4, {}});
    int64_t end = pb.numel();
    std::vector<int> seen;
    for (const GradBucket& b : buckets) {
      EXPECT_EQ(b.range.end, end) << "size " << size;
      EXPECT_GT(b.numel(), 0);
      EXPECT_EQ(b.padded_numel % 4, 0);
      EXPECT_LT(b.padded_numel - b.numel(), 4);
      // Every bucket but the last reached the size; none exceeds it by more than its last parameter.
      if (&b != &buckets.back()) {
        EXPECT_GE(b.numel(), size);
      }
      int64_t below_last = b.numel() - pb.spec(b.param_ids.back()).local_numel();
      EXPECT_LT(below_last, size);
      for (int id : b.param_ids) {
        const ParamSpec& s = pb.spec(id);
        EXPECT_GE(s.offset, b.range.begin);
        EXPECT_LE(s.offset + s.local_numel(), b.range.end);
        seen.push_back(id);
      }
      end = b.range.begin;
    }
    EXPECT_EQ(end, 0);
    ASSERT_EQ(seen.size(), 10u);
    for (int i = 0; i < 10; ++i) EXPECT_EQ(seen[static_cast<size_t>(i)], 9 - i);  // backward order
  }
}

TEST(GradBuckets, ShardsPartitionEveryBucket) {
  ParamBuffer pb = buffer_of({7, 1, 13, 2, 2, 9, 31, 4, 1, 17});
  for (int64_t dp : {1, 2, 3, 4, 8, 64}) {
    auto buckets = plan_grad_buckets(pb, {10, dp, {}});
    std::vector<int> owner(static_cast<size_t>(pb.numel()), -1);
    for (const GradBucket& b : buckets) {
      const int64_t s = b.shard_numel(dp);
      EXPECT_EQ(s * dp, b.padded_numel);
      for (int64_t r = 0; r < dp; ++r) {
        FlatRange shard = bucket_shard(b, dp, r);
        EXPECT_LE(shard.size(), s);
        if (!shard.empty()) {  // equal blocks, in rank order
          EXPECT_EQ(shard.begin, b.range.begin + r * s);
        }
        for (int64_t i = shard.begin; i < shard.end; ++i) {
          EXPECT_EQ(owner[static_cast<size_t>(i)], -1) << "element " << i << " owned twice";
          owner[static_cast<size_t>(i)] = static_cast<int>(r);
        }
      }
    }
    for (int64_t i = 0; i < pb.numel(); ++i) EXPECT_GE(owner[static_cast<size_t>(i)], 0) << "element " << i;
    // owned_ranges lists a rank's non-empty shards in bucket order.
    int64_t total = 0;
    for (int64_t r = 0; r < dp; ++r)
      for (const FlatRange& f : owned_ranges(buckets, dp, r)) {
        EXPECT_FALSE(f.empty());
        for (int64_t i = f.begin; i < f.end; ++i) EXPECT_EQ(owner[static_cast<size_t>(i)], r);
        total += f.size();
      }
    EXPECT_EQ(total, pb.numel());
  }
}

TEST(GradBuckets, ShardOfATinyBucketMayBeEmpty) {
  ParamBuffer pb = buffer_of({5});
  auto buckets = plan_grad_buckets(pb, {0, 4, {}});
  ASSERT_EQ(buckets.size(), 1u);
  EXPECT_EQ(buckets[0].padded_numel, 8);
  EXPECT_EQ(bucket_shard(buckets[0], 4, 0), (FlatRange{0, 2}));
  EXPECT_EQ(bucket_shard(buckets[0], 4, 1), (FlatRange{2, 4}));
  EXPECT_EQ(bucket_shard(buckets[0], 4, 2), (FlatRange{4, 5}));
  EXPECT_TRUE(bucket_shard(buckets[0], 4, 3).empty());
  EXPECT_TRUE(owned_ranges(buckets, 4, 3).empty());
}

}  // namespace
}  // namespace gale
