// --optimizer lion over two data-parallel ranks: Megatron's layer-wise distributed optimizer
// (--use-distributed-optimizer: whole parameters dealt to the ranks, Lion's exp_avg and the AdamW
// moments only on the owner, the updated parameters all-gathered) gives the replicated optimizer's
// losses and parameters bit for bit (it all-reduces the same gradients and Lion is element-wise;
// the gradient norm is summed in another order); each parameter has
// one owner; and a checkpoint of the sharded state resumes bit for bit. --muon-scalar-optimizer
// lion (Muon's matrices, Lion for the rest) likewise.
#include <gtest/gtest.h>

#include <filesystem>

#include "checkpoint_checks.h"
#include "mpi_test_env.h"
#include "testing_run.h"

namespace gale {
namespace {

const std::vector<std::string> kLion = {"--optimizer", "lion", "--weight-decay", "0.1"};
const std::vector<std::string> kMuonLion = {"--optimizer", "muon", "--muon-scalar-optimizer", "lion",
                                            "--muon-fp32-matmul-prec", "high"};

std::vector<std::string> flags_of(const std::vector<std::string>& optimizer, const std::vector<std::string>& layout) {
  return testing::join({testing::kPipelineTestFlags, testing::kTinyLlama, optimizer, layout});
}

void expect_layer_wise_equals_replicated(const std::vector<std::string>& optimizer) {
  const Comm world = test::world();
  testing::TestRun replicated(flags_of(optimizer, {}), world, testing::kTinyVocab);
  replicated.train(5);
  testing::TestRun layer_wise(flags_of(optimizer, {"--use-distributed-optimizer"}), world, testing::kTinyVocab);
  layer_wise.train(5);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(layer_wise.losses[i], replicated.losses[i]) << "loss of iteration " << i + 1;
    // The norm's squares are summed per owned parameter, then over the ranks: another order.
    EXPECT_NEAR(layer_wise.grad_norms[i], replicated.grad_norms[i], 1e-6 * replicated.grad_norms[i])
        << "grad norm of iteration " << i + 1;
  }
  const ParamBuffer& a = layer_wise.engine->optimizer->buffer_params(0);
  const ParamBuffer& b = replicated.engine->optimizer->buffer_params(0);
  ASSERT_EQ(a.numel(), b.numel());
  int64_t differ = 0;
  for (int64_t i = 0; i < a.numel(); ++i) differ += a.flat_params().data<float>()[i] != b.flat_params().data<float>()[i];
  EXPECT_EQ(differ, 0) << "parameters that differ after 5 steps";
}

TEST(LionLayerWise, EqualsTheReplicatedOptimizerBitForBit) {
  if (test::world()->size() != 2) GTEST_SKIP() << "needs 2 ranks";
  expect_layer_wise_equals_replicated(kLion);
}

TEST(LionLayerWise, AsMuonsScalarOptimizerEqualsTheReplicatedOptimizer) {
  if (test::world()->size() != 2) GTEST_SKIP() << "needs 2 ranks";
  expect_layer_wise_equals_replicated(kMuonLion);
}

// The state really is sharded: whole parameters, one owner each, the ranks' state bytes adding up
// to the replicated optimizer's.
TEST(LionLayerWise, EachParameterHasOneOwner) {
  const Comm world = test::world();
  if (world->size() != 2) GTEST_SKIP() << "needs 2 ranks";
  testing::TestRun run(flags_of(kLion, {"--use-distributed-optimizer"}), world, testing::kTinyVocab);
  testing::TestRun whole(flags_of(kLion, {}), make_self_communicator("world"), testing::kTinyVocab);
  const Optimizer& opt = *run.engine->optimizer;
  const ParamBuffer& pb = opt.buffer_params(0);
  ASSERT_TRUE(opt.sharded(0));
  std::vector<int64_t> owned(static_cast<size_t>(pb.size()), 0);
  for (const Optimizer::Segment& seg : opt.segments(0)) {
    EXPECT_EQ(seg.numel, pb.spec(seg.param_id).local_numel()) << pb.spec(seg.param_id).name;
    ++owned[static_cast<size_t>(seg.param_id)];
  }
  world->all_reduce(owned.data(), static_cast<int64_t>(owned.size()), DType::kI64, ReduceOp::kSum);
  for (int id = 0; id < pb.size(); ++id) {
    if (pb.spec(id).trainable) {
      EXPECT_EQ(owned[static_cast<size_t>(id)], 1) << pb.spec(id).name;
    }
  }
  int64_t bytes = opt.state_bytes();
  world->all_reduce(&bytes, 1, DType::kI64, ReduceOp::kSum);
  EXPECT_EQ(bytes, whole.engine->optimizer->state_bytes());
}

// Saved after 3 iterations by the layer-wise optimizer (each rank its own parameters' exp_avg, and
// the AdamW moments), resumed at the same layout: iterations 4-6 equal the uninterrupted run's.
TEST(LionLayerWiseCheckpoint, ResumeIsBitExact) {
  const Comm world = test::world();
  if (world->size() != 2) GTEST_SKIP() << "needs 2 ranks";
  testing::expect_resume_bit_exact(flags_of(kLion, {"--use-distributed-optimizer"}), "lion_layer_wise_exact");
}

}  // namespace
}  // namespace gale
