// build_engine's data-parallel buckets under Megatron's --ddp-num-buckets and --ddp-bucket-size:
// the bucket size each flag gives (get_model) and the buckets the first chunk is cut into.
#include "train/engine.h"

#include <gtest/gtest.h>

#include "comm/communicator.h"
#include "testing_run.h"

namespace gale {
namespace {

const std::vector<std::string> kFlags = {
    "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "8", "--seq-length", "16",
    "--max-position-embeddings", "16", "--micro-batch-size", "2", "--train-iters", "1", "--lr", "1e-3",
    "--mock-data", "--make-vocab-size-divisible-by", "64"};

std::unique_ptr<testing::TestRun> run_with(const std::vector<std::string>& extra) {
  return std::make_unique<testing::TestRun>(testing::join({kFlags, extra}), make_self_communicator("world"),
                                            testing::kTinyVocab);
}

TEST(Engine, ConfiguredBucketSizeFollowsMegatronsGetModel) {
  ParallelArgs par;
  EXPECT_EQ(configured_ddp_bucket_size(par, 1000), 0);  // neither flag: DistributedDataParallel's default
  par.ddp_num_buckets = 3;
  EXPECT_EQ(configured_ddp_bucket_size(par, 1000), 333);  // floor(parameters / N)
  par.ddp_num_buckets = 5000;
  EXPECT_EQ(configured_ddp_bucket_size(par, 1000), 1);  // more buckets than elements: one per parameter
  par.ddp_num_buckets = kUnset;
  par.ddp_bucket_size = 777;
  EXPECT_EQ(configured_ddp_bucket_size(par, 1000), 777);
}

TEST(Engine, DdpNumBucketsCutsTheFirstChunkIntoThatManyBuckets) {
  auto run = run_with({"--overlap-grad-reduce", "--ddp-num-buckets", "4"});
  const ParamBuffer& pb = run->engine->chunks[0]->params();
  const int64_t size = pb.numel() / 4;
  const auto& buckets = run->engine->dp_sync[0]->buckets();
  // Buckets close at the first parameter boundary past the size, so there are at most 4; the
  // same plan as Megatron's for that size.
  EXPECT_EQ(buckets.size(), plan_grad_buckets(pb, {size, 1, {}}).size());
  EXPECT_EQ(buckets.size(), 4u);
  for (size_t b = 0; b + 1 < buckets.size(); ++b) EXPECT_GE(buckets[b].numel(), size) << "bucket " << b;
  // Megatron buckets only with --overlap-grad-reduce: without it, one bucket.
  EXPECT_EQ(run_with({"--ddp-num-buckets", "4"})->engine->dp_sync[0]->buckets().size(), 1u);
  // --ddp-bucket-size, the same way.
  auto sized = run_with({"--overlap-grad-reduce", "--ddp-bucket-size", std::to_string(size)});
  EXPECT_EQ(sized->engine->dp_sync[0]->buckets().size(), buckets.size());
  EXPECT_EQ(run_with({"--ddp-bucket-size", "1000"})->engine->dp_sync[0]->buckets().size(), 1u);
}

}  // namespace
}  // namespace gale
