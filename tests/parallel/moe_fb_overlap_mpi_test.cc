// --moe-fb-overlap against plain DualPipeV on the same ranks: interleaving each overlapped pair's
// forward and backward at the MoE all-to-alls changes when each micro-batch's pieces run, not what
// they compute (each parameter still accumulates its micro-batches in the same order), so the losses,
// gradient norms, gradients and parameters of 4 iterations are bitwise equal: at PP2 and PP4 with
// EP 1, at TP2 × PP2 with SP and expert-TP 1, and at PP2 with EP2·DP2 (exchanges in flight while the other
// micro-batch computes), with a shared expert,
// under --bf16, with --dualpipev-dw-detach and with full recomputation, for the GPT and the
// LLaMA-like model. The interleaving must really happen (fiber switches counted).
#include <gtest/gtest.h>

#include <cstring>

#include "core/interleave.h"
#include "layouts.h"
#include "mpi_test_env.h"
#include "testing_bitwise.h"
#include "testing_run.h"

namespace gale {
namespace {

using testing::Layout;

const std::vector<std::string> kV = {"--schedules-method", "dualpipev"};
// 4 experts of which each token picks 2, plus a shared expert, over the all-to-all dispatcher.
const std::vector<std::string> kMoe = {"--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "48",
                                       "--moe-aux-loss-coeff", "0.1", "--moe-shared-expert-intermediate-size", "32",
                                       "--disable-bias-linear", "--moe-token-dispatcher-type", "alltoall",
                                       "--moe-grouped-gemm"};
const std::vector<std::string> kEp2 = {"--pipeline-model-parallel-size", "2", "--expert-model-parallel-size", "2"};

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {"pp2", 2, testing::join({{"--pipeline-model-parallel-size", "2"}, kMoe, kV})},
      {"pp2_dp2_ep2", 4, testing::join({kEp2, kMoe, kV})},
      // PP4: phase 5's pairs on ranks 0-2 and the last rank's unpaired first (F0, B1).
      {"pp4", 4, testing::join({{"--pipeline-model-parallel-size", "4", "--num-layers", "8"}, kMoe, kV})},
      // TP2 with SP and expert-TP 1: the TP collectives of both fibers on one group.
      {"tp2_pp2_sp_etp1", 4,
       testing::join({{"--pipeline-model-parallel-size", "2", "--tensor-model-parallel-size", "2", "--sequence-parallel",
                       "--expert-tensor-parallel-size", "1"},
                      kMoe,
                      kV})},
      {"pp2_dp2_ep2_bf16", 4, testing::join({kEp2, {"--bf16"}, kMoe, kV})},
      {"pp2_dp2_ep2_dw_detach", 4, testing::join({kEp2, {"--dualpipev-dw-detach"}, kMoe, kV})},
      {"pp2_dp2_ep2_recompute_full", 4,
       testing::join({kEp2,
                      {"--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers",
                       "1"},
                      kMoe,
                      kV})},
  };
  return all;
}

// 4 layers (8 at PP4), 8 micro-batches of 2 (overlapped pairs on every rank at PP2 and PP4).
const std::vector<std::string>& kCommon = testing::kPipelineTestFlags;

class MoeFbOverlap : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(MoeFbOverlap, BitwiseEqualToDualPipeV) {
  const auto& [name, llama] = GetParam();
  const Layout* layout = testing::find_layout(layouts(), name);
  ASSERT_NE(layout, nullptr) << name;
  if (layout->world != test::world()->size()) GTEST_SKIP() << name << " needs " << layout->world << " ranks";
  const std::vector<std::string> flags =
      testing::join({kCommon, llama ? testing::kTinyLlama : testing::kTinyGpt, layout->flags});
  OpTable overlap_ops = reference_ops();
  overlap_ops.moe_fb_overlap = true;  // what --moe-fb-overlap's feature sets (tests/features: its rules)
  testing::TestRun plain(flags, test::world(), testing::kTinyVocab);
  testing::TestRun overlapped(flags, test::world(), testing::kTinyVocab, EngineOptions{}, overlap_ops);
  constexpr int kIterations = 4;
  const long long before = interleave_switches();
  plain.train(kIterations);
  EXPECT_EQ(interleave_switches(), before) << "plain DualPipeV interleaved something";
  overlapped.train(kIterations);
  // Every overlapped pair switches at least once per MoE exchange of its first finisher.
  EXPECT_GT(interleave_switches(), before) << "no pair was interleaved";
  ASSERT_EQ(overlapped.engine->chunks.size(), 2u);
  const int compared = testing::expect_chunks_bit_identical(overlapped, plain, kIterations, "experts");
  EXPECT_GT(compared, 0) << "no expert among the compared parameters";
}

INSTANTIATE_TEST_SUITE_P(Layouts, MoeFbOverlap,
                         ::testing::Combine(::testing::ValuesIn(testing::layout_names(layouts())), ::testing::Bool()),
                         testing::layout_model_test_name);

}  // namespace
}  // namespace gale
