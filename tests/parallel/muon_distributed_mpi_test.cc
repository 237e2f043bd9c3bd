// Parallel invariance of Muon's distributed forms: Megatron's layer-wise distributed optimizer
// (--use-distributed-optimizer, --optimizer dist_muon: whole parameters dealt to the data-parallel
// ranks, their state only there, the updated parameters all-gathered), --muon-tp-mode distributed
// (the split matrices orthogonalised whole through TP collectives, without gathering them), and
// Muon on MoE experts (each expert's matrix on its own, split over the expert-TP group, spread over
// EP ranks, owned over expert-DP). Every layout reproduces the single-process Muon run: losses and
// grad norms within 1e-5 relative, final parameters 1e-3, gradients 3e-5 (Newton-Schulz in f32,
// --muon-fp32-matmul-prec high, so that a last-bit difference of a summed gradient or Gram matrix
// cannot round a bf16 product the other way). Checkpoints of the layer-wise state resume the run
// at the same and at other data-parallel sizes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "checkpoint_checks.h"
#include "layout_invariance.h"

namespace gale {
namespace {

using testing::Layout;

const std::vector<Layout>& dense_layouts() {
  static const std::vector<Layout> all = {
      {"dp2_distopt", 2, {"--use-distributed-optimizer"}},
      {"dp2_dist_muon_overlap", 2, {"--optimizer", "dist_muon", "--overlap-grad-reduce"}, 20000},
      {"pp2_distopt", 2, {"--pipeline-model-parallel-size", "2", "--use-distributed-optimizer"}},
      {"tp2_distributed", 2, {"--tensor-model-parallel-size", "2", "--muon-tp-mode", "distributed"}},
      {"tp2_sp_distributed", 2,
       {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--muon-tp-mode", "distributed"}},
      {"dp4_distopt", 4, {"--use-distributed-optimizer"}},
      {"tp2_dp2_sp_distopt_distributed", 4,
       {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--muon-tp-mode", "distributed",
        "--use-distributed-optimizer"}},
      {"pp2_dp2_distopt", 4, {"--pipeline-model-parallel-size", "2", "--use-distributed-optimizer"}},
  };
  return all;
}

const std::vector<std::string> kMuon = {"--optimizer", "muon", "--muon-fp32-matmul-prec", "high", "--muon-nesterov"};

// The tiny LLaMA (GQA 4 groups: the QKV split per query group, 2 groups per TP rank; SwiGLU fc1's
// gate and up blocks each split; untied output layer) of the pipeline tests, 5 iterations.
std::vector<std::string> dense_flags(const std::vector<std::string>& layout = {}) {
  return testing::join({testing::kPipelineTestFlags, testing::kTinyLlama, kMuon, layout});
}

class MuonDistributedInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(MuonDistributedInvariance, MatchesSingleProcess) {
  testing::expect_layout_matches_single_process(dense_layouts(), GetParam(), dense_flags(), 3e-5, "linear_qkv.weight");
}

INSTANTIATE_TEST_SUITE_P(Layouts, MuonDistributedInvariance,
                         ::testing::ValuesIn(testing::layout_names(dense_layouts())),
                         [](const auto& info) { return info.param; });

// The layer-wise optimizer really shards: every rank updates whole parameters, each trainable
// parameter has exactly one owner, and the ranks' state adds up to the single-process state.
TEST(MuonLayerWise, EachParameterHasOneOwnerAndItsStateLivesThere) {
  const Comm world = test::world();
  if (world->size() != 2) GTEST_SKIP() << "needs 2 ranks";
  testing::TestRun run(dense_flags({"--use-distributed-optimizer"}), world, testing::kTinyVocab);
  testing::TestRun whole(dense_flags(), make_self_communicator("world"), testing::kTinyVocab);
  const Optimizer& opt = *run.engine->optimizer;
  const ParamBuffer& pb = opt.buffer_params(0);
  ASSERT_TRUE(opt.sharded(0));
  std::vector<int64_t> owned(static_cast<size_t>(pb.size()), 0);
  for (const Optimizer::Segment& seg : opt.segments(0)) {
    EXPECT_EQ(seg.begin, pb.spec(seg.param_id).offset) << pb.spec(seg.param_id).name;
    EXPECT_EQ(seg.numel, pb.spec(seg.param_id).local_numel()) << pb.spec(seg.param_id).name;
    ++owned[static_cast<size_t>(seg.param_id)];
  }
  world->all_reduce(owned.data(), static_cast<int64_t>(owned.size()), DType::kI64, ReduceOp::kSum);
  int64_t mine = 0;
  for (const Optimizer::Segment& seg : opt.segments(0)) mine += seg.numel;
  for (int id = 0; id < pb.size(); ++id) {
    if (!pb.spec(id).trainable) continue;
    EXPECT_EQ(owned[static_cast<size_t>(id)], 1) << pb.spec(id).name;
  }
  EXPECT_GT(mine, 0);
  EXPECT_LT(mine, pb.trainable_numel());
  int64_t bytes = opt.state_bytes();
  world->all_reduce(&bytes, 1, DType::kI64, ReduceOp::kSum);
  EXPECT_EQ(bytes, whole.engine->optimizer->state_bytes());
}

// In the default "medium" precision (the iteration on bf16 values; the Gram matrices rounded to
// bf16 before and after their sum) the distributed mode stays within bf16 rounding of the
// duplicated one: the first loss equal, the later ones within 1e-4 relative.
TEST(MuonDistributedMode, MediumPrecisionStaysCloseToDuplicated) {
  const Comm world = test::world();
  if (world->size() != 2) GTEST_SKIP() << "needs 2 ranks";
  std::vector<std::string> flags = dense_flags({"--tensor-model-parallel-size", "2"});
  flags.insert(flags.end(), {"--muon-fp32-matmul-prec", "medium"});
  testing::TestRun duplicated(flags, world, testing::kTinyVocab);
  duplicated.train(5);
  flags.insert(flags.end(), {"--muon-tp-mode", "distributed"});
  testing::TestRun distributed(flags, world, testing::kTinyVocab);
  distributed.train(5);
  EXPECT_EQ(distributed.losses[0], duplicated.losses[0]);
  for (int i = 1; i < 5; ++i)
    EXPECT_NEAR(distributed.losses[i], duplicated.losses[i], 1e-4 * duplicated.losses[i]) << "iteration " << i + 1;
}

// ---- checkpoints ----

void expect_checkpoint_moves(const std::vector<std::string>& from, const std::vector<std::string>& to,
                             const std::string& name) {
  testing::expect_checkpoint_moves(
      [](const std::vector<std::string>& layout) { return dense_flags(layout); }, from, to, "muon_" + name);
}

// Saved by the layer-wise optimizer after 3 iterations (each rank writes the momentum or Adam
// moments of the parameters it owns), resumed at DP 2 layer-wise, and at DP 1 (TP 2, distributed
// mode): iterations 4-6 give the uninterrupted single-process run's losses and grad norms.
TEST(MuonLayerWiseCheckpoint, ResumesAtTheSameAndAnotherDataParallelSize) {
  if (test::world()->size() != 2) GTEST_SKIP() << "needs 2 ranks";
  expect_checkpoint_moves({"--use-distributed-optimizer"}, {"--use-distributed-optimizer"}, "dp2_to_dp2");
  expect_checkpoint_moves({"--use-distributed-optimizer"},
                          {"--tensor-model-parallel-size", "2", "--muon-tp-mode", "distributed"}, "dp2_to_tp2");
}

// The same layout resumed continues bit for bit: each rank's Muon momentum and Adam moments of the
// parameters it owns come back exactly.
TEST(MuonLayerWiseCheckpoint, ResumeIsBitExact) {
  const Comm world = test::world();
  if (world->size() != 2) GTEST_SKIP() << "needs 2 ranks";
  testing::expect_resume_bit_exact(dense_flags({"--use-distributed-optimizer"}), "muon_layer_wise_exact");
}

TEST(MuonLayerWiseCheckpoint, MovesFromDp4ToTp2Dp2) {
  if (test::world()->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  expect_checkpoint_moves({"--use-distributed-optimizer"},
                          {"--tensor-model-parallel-size", "2", "--use-distributed-optimizer"}, "dp4_to_tp2_dp2");
}

// ---- MoE experts ----

const std::vector<Layout>& moe_layouts() {
  static const std::vector<Layout> all = {
      {"dp2_distopt", 2, {"--use-distributed-optimizer"}},
      {"ep2", 2, {"--expert-model-parallel-size", "2"}},
      {"ep2_distopt", 2, {"--expert-model-parallel-size", "2", "--use-distributed-optimizer"}},
      // The experts split over the expert-TP group (= TP): fc1's gate and up blocks by rows, fc2 by columns.
      {"tp2_sp", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
      {"tp2_sp_distributed", 2,
       {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--muon-tp-mode", "distributed"}},
      // Expert-DP 2: the experts' owners dealt over it.
      {"ep2_dp4_distopt", 4, {"--expert-model-parallel-size", "2", "--use-distributed-optimizer"}},
      {"tp2_sp_ep2_distributed", 4,
       {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--expert-model-parallel-size", "2",
        "--muon-tp-mode", "distributed"}},
      {"tp2_sp_etp1_dp2_distopt", 4,
       {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--expert-tensor-parallel-size", "1",
        "--use-distributed-optimizer"}},
  };
  return all;
}

class MuonMoeInvariance : public ::testing::TestWithParam<std::string> {};

// The tiny Mixtral (4 SwiGLU experts in 3 of 4 layers, a gated shared expert, the router: all
// matrices Muon updates), all-to-all dispatch.
TEST_P(MuonMoeInvariance, MatchesSingleProcess) {
  testing::expect_layout_matches_single_process(
      moe_layouts(), GetParam(),
      testing::join({testing::tiny_mixtral_flags(4, "alltoall"), kMuon, {"--clip-grad", "0.5", "--train-iters", "5"}}),
      3e-5, "local_experts.1.linear_fc1.weight");
}

INSTANTIATE_TEST_SUITE_P(Layouts, MuonMoeInvariance, ::testing::ValuesIn(testing::layout_names(moe_layouts())),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace gale
