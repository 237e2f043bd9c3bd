// --reset-bucket-group-order on 4 ranks (PP2 x DP2, tied embeddings, distributed optimizer,
// overlapped gradient reduction and parameter all-gather, small buckets): each stage records the
// order its first forward used its buckets in and chains the prefetches in that order; the losses,
// grad norms and parameters are bit-identical to the run without the flag. Gale's GPTModel
// registers its parameters in forward order (the last stage's copy of the tied embedding last, with
// the output layer), so the recorded order is the buffer's reversed on both stages and neither run
// waits for an unprefetched all-gather; tests/optim/data_parallel_sync_mpi_test.cc drives a forward
// that uses the buckets in another order, where the flag removes the waits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "mpi_test_env.h"
#include "testing_run.h"
#include "train/grad_sync.h"

namespace gale {
namespace {

const std::vector<std::string> kFlags = {
    "--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
    "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "6",
    "--lr", "3e-3", "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--mock-data", "--eval-iters", "0",
    "--log-interval", "1000", "--make-vocab-size-divisible-by", "64", "--pipeline-model-parallel-size", "2",
    "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"};
constexpr int64_t kBucketElements = 3000;  // several buckets per stage

std::vector<float> values(testing::TestRun& run) {
  finish_param_sync(*run.engine);
  const ParamBuffer& pb = run.model().params();
  std::vector<float> v(static_cast<size_t>(pb.numel()));
  pb.read_values(0, pb.numel(), v.data());
  return v;
}

TEST(ResetBucketGroupOrder, RecordsEachStagesForwardOrderAndTrainsBitIdentically) {
  if (test::world()->size() != 4) GTEST_SKIP() << "needs 4 ranks (PP2 x DP2)";
  testing::TestRun plain(kFlags, test::world(), 60, EngineOptions{kBucketElements});
  testing::TestRun reset(testing::join({kFlags, {"--reset-bucket-group-order"}}), test::world(), 60,
                         EngineOptions{kBucketElements});
  const DataParallelSync& ps = *plain.engine->dp_sync.at(0);
  const DataParallelSync& rs = *reset.engine->dp_sync.at(0);
  ASSERT_GE(rs.buckets().size(), 3u);
  ASSERT_EQ(ps.buckets().size(), rs.buckets().size());

  const int iterations = 6;
  const std::vector<double> a = plain.train(iterations), b = reset.train(iterations);
  for (int i = 0; i < iterations; ++i) {
    EXPECT_EQ(a[i], b[i]) << "loss of iteration " << i + 1;
    EXPECT_EQ(plain.grad_norms[i], reset.grad_norms[i]) << "grad norm of iteration " << i + 1;
  }
  EXPECT_NE(a[0], a[iterations - 1]);
  EXPECT_TRUE(values(plain) == values(reset));

  // The recorded order holds every bucket once.
  std::vector<int> order = rs.recorded_bucket_order();
  ASSERT_EQ(order.size(), rs.buckets().size());
  EXPECT_EQ(rs.first_param_gather(), order.front());
  for (size_t i = 0; i + 1 < order.size(); ++i) EXPECT_EQ(rs.next_param_gather(order[i]), order[i + 1]);
  EXPECT_EQ(rs.next_param_gather(order.back()), -1);
  std::vector<int> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) EXPECT_EQ(sorted[i], static_cast<int>(i));
  EXPECT_TRUE(ps.recorded_bucket_order().empty());

  // The first iteration gathers nothing (nothing stale yet); every later forward finds its bucket
  // prefetched with the recorded order.
  EXPECT_EQ(rs.unprefetched_param_gathers(), 0);
  std::vector<int> buffer_order(rs.buckets().size());
  for (size_t i = 0; i < buffer_order.size(); ++i) buffer_order[i] = static_cast<int>(buffer_order.size() - 1 - i);
  EXPECT_EQ(order, buffer_order) << "pipeline stage " << plain.engine->ps.coords().pp;
  EXPECT_EQ(ps.unprefetched_param_gathers(), 0);
}

}  // namespace
}  // namespace gale
