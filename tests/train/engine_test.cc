// build_engine's data-parallel buckets under Megatron's --ddp-num-buckets and --ddp-bucket-size:
// the bucket size each flag gives (get_model) and the buckets the first chunk is cut into; under
// --freeze-all-layers no optimizer state (the allocator's bytes).
#include "train/engine.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "comm/communicator.h"
#include "core/allocator.h"
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

// --freeze-all-layers: Megatron's optimizer has no trainable parameter (None), so Gale's holds no state:
// the frozen engine takes exactly AdamW's two f32 moments per parameter element fewer bytes from the
// allocator than the same engine unfrozen, and its forward-only steps leave the weights as they were.
TEST(Engine, FreezeAllLayersAllocatesNoOptimizerState) {
  const int64_t before = host_allocator().current_bytes();
  auto trained = run_with({});
  const int64_t trained_bytes = host_allocator().current_bytes() - before;
  const int64_t before_frozen = host_allocator().current_bytes();
  auto frozen = run_with({"--freeze-all-layers"});
  const int64_t frozen_bytes = host_allocator().current_bytes() - before_frozen;
  const int64_t numel = trained->model().params().trainable_numel();
  EXPECT_EQ(trained->engine->optimizer->state_bytes(), 2 * 4 * numel);
  EXPECT_EQ(frozen->engine->optimizer->state_bytes(), 0);
  EXPECT_EQ(trained_bytes - frozen_bytes, 2 * 4 * numel);
  const Tensor weights = frozen->model().params().flat_params().clone();
  const std::vector<double> losses = frozen->train(2);
  ASSERT_EQ(losses.size(), 2u);
  EXPECT_TRUE(std::isfinite(losses[0]));
  EXPECT_EQ(std::memcmp(weights.raw(), frozen->model().params().flat_params().raw(), weights.nbytes()), 0);
}

}  // namespace
}  // namespace gale
