// --compress-optimizer with the distributed optimizer at DP2 under mpirun: each rank compresses its
// shard of the Adam state, and training (losses, gradient norms, parameters, the state read back)
// is the uncompressed DP2 run's, bit for bit; so is a plain DP2 run (replicated state), and PP2
// with two model chunks per rank (two optimizer buffers planned as one).
#include <gtest/gtest.h>

#include <cstring>

#include "mpi_test_env.h"
#include "optimizer_test_model.h"
#include "testing_checkpoint_run.h"

namespace gale {
namespace {

struct PackRun : testing::CheckpointRun {
  PackRun(const Comm& world, const std::vector<std::string>& flags)
      : CheckpointRun(testing::join({testing::optimizer_test_model("6", "0.1"), flags}), world, testing::kTinyVocab,
                      EngineOptions{20000, {}}) {}
};

void expect_bit_identical(PackRun& plain, PackRun& packed, const std::string& what) {
  const std::vector<double> a = plain.train(4), b = packed.train(4);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(a[i], b[i]) << what << " iteration " << i + 1;
    EXPECT_EQ(plain.grad_norms[i], packed.grad_norms[i]) << what << " iteration " << i + 1;
  }
  EXPECT_NE(a[0], a[3]) << what;
  EXPECT_EQ(plain.values(), packed.values()) << what;
  ASSERT_EQ(plain.engine->optimizer->num_buffers(), packed.engine->optimizer->num_buffers());
  for (size_t c = 0; c < plain.engine->optimizer->num_buffers(); ++c) {
    const auto ps = plain.engine->optimizer->state(c), ss = packed.engine->optimizer->state(c);
    ASSERT_EQ(ps.size(), ss.size());
    for (size_t k = 0; k < ps.size(); ++k) {
      ASSERT_EQ(ps[k].second.numel(), ss[k].second.numel());
      EXPECT_EQ(std::memcmp(ps[k].second.data<float>(), ss[k].second.data<float>(), ps[k].second.nbytes()), 0)
          << what << ": " << ps[k].first << " of chunk " << c;
    }
  }
  const OptimizerStateSwap* store = packed.engine->optimizer->swap();
  ASSERT_NE(store, nullptr);
  EXPECT_TRUE(store->compressed());
  EXPECT_LT(store->compressed_bytes(), store->raw_bytes()) << what;
}

TEST(CompressOptimizerDp, ShardedStateCompressesBitIdentically) {
  Comm world = test::world();
  if (world->size() != 2) GTEST_SKIP() << "needs DP2";
  const std::vector<std::string> dist = {"--use-distributed-optimizer", "--overlap-grad-reduce"};
  PackRun plain(world, dist);
  ASSERT_GT(plain.engine->dp_sync[0]->buckets().size(), 2u);
  PackRun packed(world, testing::join({dist, {"--compress-optimizer"}}));
  // Each rank holds its shard's state: about half of the elements.
  EXPECT_EQ(packed.engine->optimizer->swap()->raw_bytes(), plain.engine->optimizer->state_bytes());
  expect_bit_identical(plain, packed, "distributed optimizer");
}

TEST(CompressOptimizerDp, ReplicatedStateCompressesBitIdentically) {
  Comm world = test::world();
  if (world->size() != 2) GTEST_SKIP() << "needs DP2";
  PackRun plain(world, {});
  PackRun packed(world, {"--compress-optimizer"});
  expect_bit_identical(plain, packed, "DP2");
}

TEST(CompressOptimizerDp, TwoModelChunksPerRankCompressBitIdentically) {
  Comm world = test::world();
  if (world->size() != 2) GTEST_SKIP() << "needs PP2";
  const std::vector<std::string> pp = {"--pipeline-model-parallel-size", "2", "--num-virtual-stages-per-pipeline-rank",
                                       "2", "--num-layers", "4", "--use-distributed-optimizer"};
  PackRun plain(world, pp);
  PackRun packed(world, testing::join({pp, {"--compress-optimizer"}}));
  ASSERT_EQ(packed.engine->optimizer->num_buffers(), 2u);
  expect_bit_identical(plain, packed, "PP2 x 2 chunks");
}

}  // namespace
}  // namespace gale
