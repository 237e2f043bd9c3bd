// --quant-grads at DP2 under mpirun: the FP16 main gradients' scales are aligned (MIN) across the two
// ranks and the reduced gradients the optimizers read are identical on both; the DP2 run stays within
// a stated tolerance of the one-process run of the same global batch (their FP16 roundings differ: 2
// accumulations per rank plus the alignment and the sum, against 4 accumulations); the distributed
// optimizer (reduce-scatter, owned shards dequantised) reproduces the replicated DP2 run's losses and
// parameters bit for bit; with --calculate-per-token-loss (a sum without 1/DP) the scales leave the
// FP16 sum its headroom; under TP2 with sequence parallelism the norms keep f32 slots.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "mpi_test_env.h"
#include "optimizer_test_model.h"
#include "testing_checkpoint_run.h"

namespace gale {
namespace {

struct QgRun : testing::CheckpointRun {
  QgRun(const Comm& world, const std::vector<std::string>& flags)
      : CheckpointRun(testing::join({testing::optimizer_test_model("12", "0.0"), {"--quant-grads"}, flags}), world,
                      testing::kTinyVocab) {}
};

// Elementwise MIN and MAX over the world agree: every rank holds the same values.
bool same_on_every_rank(const Comm& world, std::vector<float> v) {
  std::vector<float> lo = v, hi = v;
  world->all_reduce(lo.data(), static_cast<int64_t>(lo.size()), DType::kF32, ReduceOp::kMin);
  world->all_reduce(hi.data(), static_cast<int64_t>(hi.size()), DType::kF32, ReduceOp::kMax);
  return lo == hi;
}

// Tolerance: each run's gradient is within FP16 rounding of the f32 gradient (about 4·2^-11
// relative at most, tests/kernels/quant_grads_test.cc), so the runs differ by at most what
// tests/train/quant_grads_test.cc allows between --quant-grads and f32: 1e-3 relative in the loss.
// Measured (docs/model.md): about 1e-6 over 6 iterations.
TEST(QuantGradsDp, Dp2WithinToleranceOfOneProcessAndAlignedAcrossRanks) {
  Comm world = test::world();
  if (world->size() != 2) GTEST_SKIP() << "needs DP2";
  QgRun one(make_self_communicator("self"), {});
  QgRun dp2(world, {});
  const std::vector<double> a = one.train(6);
  std::vector<double> b;
  for (int i = 0; i < 6; ++i) {
    b.push_back(dp2.train(1)[0]);
    const ParamBuffer& pb = dp2.engine->chunks[0]->params();
    QuantGradStore& store = *dp2.engine->quant_grads[0];
    std::vector<float> scales, g;
    for (int id = 0; id < pb.size(); ++id)
      if (store.codes(id)) {
        scales.push_back(store.scale(id));
        const std::vector<float> x = store.main_grad_copy(id);  // the reduced gradient the optimizer read
        g.insert(g.end(), x.begin(), x.end());
      }
    ASSERT_FALSE(scales.empty());
    EXPECT_TRUE(same_on_every_rank(world, scales)) << "scales aligned, iteration " << i + 1;
    EXPECT_TRUE(same_on_every_rank(world, g)) << "reduced gradients, iteration " << i + 1;
  }
  // The first step's gradients: each within 4·2^-11 (relative, in norm) of the same f32 gradient.
  const double first = std::fabs(dp2.grad_norms[0] - one.grad_norms[0]) / one.grad_norms[0];
  if (world->rank() == 0)
    std::printf("quant-grads DP2 vs one process: first gradient norm relative difference %.3g\n", first);
  EXPECT_LT(first, 8.0 * 0x1p-11);
  double worst = 0.0;
  for (int i = 0; i < 6; ++i) worst = std::max(worst, std::fabs(a[i] - b[i]) / a[i]);
  if (world->rank() == 0)
    std::printf("quant-grads DP2 vs one process: worst relative loss difference over 6 iterations %.3g\n", worst);
  EXPECT_LT(worst, 1e-3);
  EXPECT_LT(b.back(), b.front()) << "it trains";
}

TEST(QuantGradsDp, DistributedOptimizerMatchesReplicated) {
  Comm world = test::world();
  if (world->size() != 2) GTEST_SKIP() << "needs DP2";
  QgRun replicated(world, {});
  QgRun sharded(world, {"--use-distributed-optimizer"});
  const std::vector<double> a = replicated.train(4), b = sharded.train(4);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(a[i], b[i]) << "iteration " << i + 1;
    // The norm sums its squares over the shards in another order: equal up to that rounding.
    EXPECT_NEAR(replicated.grad_norms[i], sharded.grad_norms[i], 1e-9 * replicated.grad_norms[i]) << i + 1;
  }
  EXPECT_EQ(replicated.values(), sharded.values());
  // Neither keeps a whole f32 gradient buffer: the sum ran through the store's scratch.
  for (const QgRun* r : {&replicated, &sharded})
    EXPECT_FALSE(r->engine->chunks[0]->params().flat_grads().defined());
}

// --calculate-per-token-loss sums the ranks' gradients without the 1/DP factor: two FP16 values near
// 65503 would overflow, so the aligned scales are halved first (the sum's headroom). The run trains
// (every gradient finite) within the tolerance above of the same run with f32 gradients.
TEST(QuantGradsDp, PerTokenLossSumHasHeadroom) {
  Comm world = test::world();
  if (world->size() != 2) GTEST_SKIP() << "needs DP2";
  const std::vector<std::string> per_token = {"--calculate-per-token-loss", "--use-distributed-optimizer"};
  testing::CheckpointRun f32(testing::join({testing::optimizer_test_model("12", "0.0"), per_token}), world,
                             testing::kTinyVocab);
  QgRun q(world, per_token);
  const std::vector<double> a = f32.train(4), b = q.train(4);
  double worst = 0.0;
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(std::isfinite(q.grad_norms[i])) << "iteration " << i + 1;
    worst = std::max(worst, std::fabs(a[i] - b[i]) / a[i]);
  }
  if (world->rank() == 0)
    std::printf("quant-grads DP2 --calculate-per-token-loss vs f32 gradients: worst relative loss difference %.3g\n",
                worst);
  EXPECT_LT(worst, 1e-3);
}


// TP2 with sequence parallelism: the norms' and row-parallel biases' gradients are summed over TP in
// f32 after the data-parallel step, so they keep f32 slots (resident, as the tied word embedding);
// every other parameter's f32 gradient lives in the one-layer scratch. The run stays within the
// tolerance above of the same run with f32 gradients.
TEST(QuantGradsDp, SequenceParallelNormsAreResident) {
  Comm world = test::world();
  if (world->size() != 2) GTEST_SKIP() << "needs TP2";
  const std::vector<std::string> tp = {"--tensor-model-parallel-size", "2", "--sequence-parallel"};
  testing::CheckpointRun f32(testing::join({testing::optimizer_test_model("12", "0.0"), tp}), world,
                             testing::kTinyVocab);
  QgRun q(world, tp);
  const std::vector<double> a = f32.train(4), b = q.train(4);
  double worst = 0.0;
  for (int i = 0; i < 4; ++i) worst = std::max(worst, std::fabs(a[i] - b[i]) / a[i]);
  if (world->rank() == 0)
    std::printf("quant-grads TP2 + SP vs f32 gradients: worst relative loss difference %.3g\n", worst);
  EXPECT_LT(worst, 1e-3);
  const GPTModel& m = *q.engine->chunks[0];
  const ParamBuffer& pb = m.params();
  const QuantGradStore& store = *q.engine->quant_grads[0];
  int sp = 0;
  for (int id = 0; id < pb.size(); ++id) {
    const bool want = pb.spec(id).sequence_parallel || id == m.word_embedding_id();
    EXPECT_EQ(store.resident(id), want) << pb.spec(id).name;
    sp += pb.spec(id).sequence_parallel ? 1 : 0;
  }
  EXPECT_GT(sp, 0) << "sequence-parallel parameters";
  EXPECT_FALSE(pb.flat_grads().defined());
  EXPECT_LT(store.f32_bytes(), 4 * pb.trainable_numel());
}

}  // namespace
}  // namespace gale
