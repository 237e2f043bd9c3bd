// Bucketed data-parallel sync under mpirun (the world is the data-parallel group): gradients are
// averaged bucket by bucket (all-reduce, or reduce-scatter into the owned shards), overlapped
// buckets start exactly when their last parameter is complete on the last micro-batch, and the
// distributed optimizer's parameter all-gather restores every element, at once or bucket by
// bucket just before the forward uses it.
#include <gtest/gtest.h>

#include <cmath>

#include "mpi_test_env.h"
#include "optim/data_parallel_sync.h"
#include "small_param_buffer.h"

namespace gale {
namespace {

float local_grad(int rank, int64_t i) { return 0.5f * static_cast<float>(rank + 1) + 0.01f * static_cast<float>(i); }
double mean_grad(int dp, int64_t i) { return 0.25 * (dp + 1) + 0.01 * static_cast<double>(i); }
float true_param(int64_t i) { return 1.0f + 0.001f * static_cast<float>(i); }

void fill_local_grads(ParamBuffer& pb, int rank) {
  float* g = pb.flat_grads().data<float>();
  for (int64_t i = 0; i < pb.numel(); ++i) g[i] = local_grad(rank, i);
}

bool in_ranges(const std::vector<FlatRange>& ranges, int64_t i) {
  for (const FlatRange& r : ranges)
    if (r.begin <= i && i < r.end) return true;
  return false;
}

int64_t padded_total(const std::vector<GradBucket>& buckets) {
  int64_t n = 0;
  for (const GradBucket& b : buckets) n += b.padded_numel;
  return n;
}

DataParallelConfig config(bool sharded, bool overlap_grad, bool overlap_param, int64_t bucket_size) {
  DataParallelConfig c;
  c.use_distributed_optimizer = sharded;
  c.overlap_grad_reduce = overlap_grad;
  c.overlap_param_gather = overlap_param;
  c.bucket_size = bucket_size;
  return c;
}

int64_t calls(const Comm& c, CommOp op) { return c->stats().calls[static_cast<int>(op)]; }
int64_t bytes(const Comm& c, CommOp op) { return c->stats().bytes[static_cast<int>(op)]; }

TEST(DataParallelSync, AllReduceAveragesEveryBucket) {
  Comm dp = test::world();
  ParamBuffer pb = testing::small_param_buffer();
  DataParallelSync sync(&pb, dp, config(false, false, false, 10));
  ASSERT_GT(sync.buckets().size(), 3u);
  fill_local_grads(pb, 0);
  sync.start_iteration(1);
  for (int64_t i = 0; i < pb.numel(); ++i) ASSERT_EQ(pb.flat_grads().data<float>()[i], 0.0f) << "not zeroed";
  fill_local_grads(pb, dp->rank());
  dp->reset_stats();
  sync.finish_grad_sync();
  const float* g = pb.flat_grads().data<float>();
  for (int64_t i = 0; i < pb.numel(); ++i) EXPECT_NEAR(g[i], mean_grad(dp->size(), i), 1e-6) << "element " << i;
  if (dp->size() > 1) {
    EXPECT_EQ(calls(dp, CommOp::kAllReduce), static_cast<int64_t>(sync.buckets().size()));
    EXPECT_EQ(bytes(dp, CommOp::kAllReduce), 4 * pb.numel());
  }
  EXPECT_EQ(sync.owned_ranges(), (std::vector<FlatRange>{{0, pb.numel()}}));
}

TEST(DataParallelSync, ReduceScatterLeavesTheMeanInOwnedShards) {
  Comm dp = test::world();
  ParamBuffer pb = testing::small_param_buffer();
  DataParallelSync sync(&pb, dp, config(true, false, false, 10));
  sync.start_iteration(1);
  fill_local_grads(pb, dp->rank());
  dp->reset_stats();
  sync.finish_grad_sync();
  const std::vector<FlatRange> owned = sync.owned_ranges();
  int64_t mine = 0;
  const float* g = pb.flat_grads().data<float>();
  for (int64_t i = 0; i < pb.numel(); ++i)
    if (in_ranges(owned, i)) {
      EXPECT_NEAR(g[i], mean_grad(dp->size(), i), 1e-6) << "element " << i;
      ++mine;
    }
  if (dp->size() > 1) {
    EXPECT_EQ(calls(dp, CommOp::kReduceScatter), static_cast<int64_t>(sync.buckets().size()));
    EXPECT_EQ(bytes(dp, CommOp::kReduceScatter), 4 * padded_total(sync.buckets()));
    EXPECT_EQ(calls(dp, CommOp::kAllReduce), 0);
  }
  EXPECT_EQ(dp->all_reduce_scalar(mine), pb.numel()) << "the shards must cover the buffer exactly once";
}

TEST(DataParallelSync, OverlapStartsEachBucketWhenItsLastParameterIsDone) {
  Comm dp = test::world();
  for (bool sharded : {false, true}) {
    ParamBuffer pb = testing::small_param_buffer();
    DataParallelSync sync(&pb, dp, config(sharded, true, false, 10));
    const auto& buckets = sync.buckets();
    sync.start_iteration(2);
    fill_local_grads(pb, dp->rank());
    dp->reset_stats();
    const CommOp op = sharded ? CommOp::kReduceScatter : CommOp::kAllReduce;
    // Micro-batch 0: every parameter reported, nothing may start.
    for (const GradBucket& b : buckets) sync.on_grads_ready(b.param_ids);
    EXPECT_EQ(calls(dp, op), 0);
    // Micro-batch 1: a bucket starts when its last parameter is reported, not before.
    for (size_t b = 0; b < buckets.size(); ++b) {
      const std::vector<int>& ids = buckets[b].param_ids;
      for (size_t k = 0; k < ids.size(); ++k) {
        EXPECT_EQ(calls(dp, op), static_cast<int64_t>(b)) << "bucket " << b << " started early";
        sync.on_grads_ready({ids[k]});
      }
      EXPECT_EQ(calls(dp, op), static_cast<int64_t>(b + 1)) << "bucket " << b << " did not start";
    }
    sync.finish_grad_sync();
    EXPECT_EQ(calls(dp, op), static_cast<int64_t>(buckets.size()));
    const std::vector<FlatRange> owned = sync.owned_ranges();
    const float* g = pb.flat_grads().data<float>();
    for (int64_t i = 0; i < pb.numel(); ++i)
      if (in_ranges(owned, i)) {
        EXPECT_NEAR(g[i], mean_grad(dp->size(), i), 1e-6) << "element " << i;
      }
  }
}

TEST(DataParallelSync, UnreportedBucketsStillReduceAtTheEnd) {
  Comm dp = test::world();
  ParamBuffer pb = testing::small_param_buffer();
  DataParallelSync sync(&pb, dp, config(false, true, false, 10));
  sync.start_iteration(1);
  fill_local_grads(pb, dp->rank());
  sync.on_grads_ready(sync.buckets()[0].param_ids);  // only the first bucket reported
  sync.finish_grad_sync();
  const float* g = pb.flat_grads().data<float>();
  for (int64_t i = 0; i < pb.numel(); ++i) EXPECT_NEAR(g[i], mean_grad(dp->size(), i), 1e-6) << "element " << i;
}

// Parameters as after the optimizer step: owned elements hold their new value, the rest junk.
void fill_stale_params(ParamBuffer& pb, const std::vector<FlatRange>& owned) {
  float* p = pb.flat_params().data<float>();
  for (int64_t i = 0; i < pb.numel(); ++i) p[i] = in_ranges(owned, i) ? true_param(i) : -1000.0f;
}

TEST(DataParallelSync, AllGatherRestoresEveryParameterAfterTheStep) {
  Comm dp = test::world();
  ParamBuffer pb = testing::small_param_buffer();
  DataParallelSync sync(&pb, dp, config(true, false, false, 10));
  sync.start_iteration(1);
  sync.finish_grad_sync();
  fill_stale_params(pb, sync.owned_ranges());
  dp->reset_stats();
  sync.after_optimizer_step();
  const float* p = pb.flat_params().data<float>();
  for (int64_t i = 0; i < pb.numel(); ++i) EXPECT_EQ(p[i], true_param(i)) << "element " << i;
  if (dp->size() > 1) {
    EXPECT_EQ(calls(dp, CommOp::kAllGather), static_cast<int64_t>(sync.buckets().size()));
    EXPECT_EQ(bytes(dp, CommOp::kAllGather), 4 * padded_total(sync.buckets()));
  }
}

TEST(DataParallelSync, OverlappedAllGatherCompletesEachBucketBeforeItsUse) {
  Comm dp = test::world();
  if (dp->size() == 1) GTEST_SKIP() << "nothing to gather with one rank";
  ParamBuffer pb = testing::small_param_buffer();
  DataParallelSync sync(&pb, dp, config(true, true, true, 10));
  const auto& buckets = sync.buckets();
  ASSERT_GE(buckets.size(), 3u);
  sync.start_iteration(1);
  sync.finish_grad_sync();
  fill_stale_params(pb, sync.owned_ranges());
  dp->reset_stats();
  sync.after_optimizer_step();
  EXPECT_EQ(calls(dp, CommOp::kAllGather), 0) << "the gather belongs to the next forward";
  sync.start_iteration(1);  // launches the bucket the forward needs first (the last one)
  EXPECT_EQ(calls(dp, CommOp::kAllGather), 1);
  const float* p = pb.flat_params().data<float>();
  // The forward visits buckets from the last to the first; each is complete when needed, and the
  // next one is being prefetched.
  for (size_t b = buckets.size(); b-- > 0;) {
    sync.on_params_needed(buckets[b].param_ids);
    for (int64_t i = buckets[b].range.begin; i < buckets[b].range.end; ++i)
      ASSERT_EQ(p[i], true_param(i)) << "bucket " << b << " element " << i;
    EXPECT_EQ(calls(dp, CommOp::kAllGather), static_cast<int64_t>(buckets.size() - b + (b > 0 ? 1 : 0)));
  }
  sync.on_params_needed(buckets[0].param_ids);  // nothing left to do
  EXPECT_EQ(calls(dp, CommOp::kAllGather), static_cast<int64_t>(buckets.size()));
}

TEST(DataParallelSync, FinishParamSyncGathersWhatTheForwardHasNotYetUsed) {
  Comm dp = test::world();
  ParamBuffer pb = testing::small_param_buffer();
  DataParallelSync sync(&pb, dp, config(true, true, true, 10));
  sync.start_iteration(1);
  sync.finish_grad_sync();
  fill_stale_params(pb, sync.owned_ranges());
  sync.after_optimizer_step();
  sync.finish_param_sync();
  const float* p = pb.flat_params().data<float>();
  for (int64_t i = 0; i < pb.numel(); ++i) EXPECT_EQ(p[i], true_param(i)) << "element " << i;
}

// A forward that uses the buckets in the buffer's order, 0 first: the opposite of what the
// prefetch assumes.
std::vector<size_t> front_to_back(size_t n) {
  std::vector<size_t> order(n);
  for (size_t b = 0; b < n; ++b) order[b] = b;
  return order;
}

// One iteration whose forward uses the buckets in `order`, after a step left them stale; checks each
// bucket is complete when used. Returns the all-gathers the forward found not prefetched.
int64_t forward_in_order(DataParallelSync& sync, ParamBuffer& pb, const std::vector<size_t>& order) {
  sync.start_iteration(1);
  sync.finish_grad_sync();
  fill_stale_params(pb, sync.owned_ranges());
  sync.after_optimizer_step();
  const int64_t before = sync.unprefetched_param_gathers();
  sync.start_iteration(1);
  const float* p = pb.flat_params().data<float>();
  for (size_t b : order) {
    sync.on_params_needed(sync.buckets()[b].param_ids);
    for (int64_t i = sync.buckets()[b].range.begin; i < sync.buckets()[b].range.end; ++i)
      EXPECT_EQ(p[i], true_param(i)) << "bucket " << b << " element " << i;
  }
  sync.finish_grad_sync();
  return sync.unprefetched_param_gathers() - before;
}

TEST(DataParallelSync, BufferOrderPrefetchWaitsWhenTheForwardUsesAnotherOrder) {
  Comm dp = test::world();
  if (dp->size() == 1) GTEST_SKIP() << "nothing to gather with one rank";
  ParamBuffer pb = testing::small_param_buffer();
  DataParallelSync sync(&pb, dp, config(true, true, true, 10));
  const size_t n = sync.buckets().size();
  ASSERT_GE(n, 4u);
  // The buffer's order (last to first) is all prefetched.
  std::vector<size_t> buffer_order;
  for (size_t b = n; b-- > 0;) buffer_order.push_back(b);
  EXPECT_EQ(forward_in_order(sync, pb, buffer_order), 0);
  // Front to back, every bucket but the last (prefetched by start_iteration) is gathered while the
  // forward waits: bucket b's prefetch goes to b - 1, already used.
  EXPECT_EQ(forward_in_order(sync, pb, front_to_back(n)), static_cast<int64_t>(n) - 1);
  EXPECT_TRUE(sync.recorded_bucket_order().empty());
}

TEST(DataParallelSync, ResetBucketGroupOrderPrefetchesInTheFirstForwardsOrder) {
  Comm dp = test::world();
  if (dp->size() == 1) GTEST_SKIP() << "nothing to gather with one rank";
  ParamBuffer pb = testing::small_param_buffer();
  DataParallelConfig c = config(true, true, true, 10);
  c.reset_bucket_group_order = true;
  DataParallelSync sync(&pb, dp, c);
  const size_t n = sync.buckets().size();
  ASSERT_GE(n, 4u);
  EXPECT_EQ(sync.first_param_gather(), static_cast<int>(n) - 1) << "before recording: the buffer's order";
  const std::vector<size_t> order = front_to_back(n);
  // The recording forward still prefetches in the buffer's order (the order is complete only at its
  // end): as many waits as without the flag.
  ParamBuffer plain_pb = testing::small_param_buffer();
  DataParallelSync plain(&plain_pb, dp, config(true, true, true, 10));
  EXPECT_EQ(forward_in_order(plain, plain_pb, order), static_cast<int64_t>(n) - 1);
  EXPECT_EQ(forward_in_order(sync, pb, order), static_cast<int64_t>(n) - 1);
  ASSERT_EQ(sync.recorded_bucket_order().size(), n);
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(sync.recorded_bucket_order()[i], static_cast<int>(order[i]));
  EXPECT_EQ(sync.first_param_gather(), static_cast<int>(order[0]));
  EXPECT_EQ(sync.next_param_gather(order.back()), -1);
  // From then on every bucket is prefetched, for as many iterations as run.
  for (int it = 0; it < 3; ++it) EXPECT_EQ(forward_in_order(sync, pb, order), 0) << "iteration " << it;
  // A parameter asked for twice (tied weights) does not disturb the recorded order.
  sync.on_params_needed(sync.buckets()[order[0]].param_ids);
  EXPECT_EQ(sync.recorded_bucket_order().size(), n);
}

}  // namespace
}  // namespace gale
