// Parallel invariance of the DualPipeV schedule (--schedules-method dualpipev): PP2 and PP4 in the V
// placement (rank 0 holding the embedding and the loss), alone and with DP2, TP2 with sequence
// parallelism, CP2 and the distributed optimizer (with overlapped gradient reduction and parameter
// gathering) reproduce the single-process run: losses and grad norms within 1e-5 relative,
// final parameters and gradients as tests/parallel/alibi_invariance_mpi_test.cc. The GPT model ties
// its output layer to the word embedding (both on rank 0 under DualPipeV), the LLaMA-like one does not.
#include <gtest/gtest.h>

#include "layout_invariance.h"

namespace gale {
namespace {

using testing::Layout;

const std::vector<std::string> kV = {"--schedules-method", "dualpipev"};

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {"pp2", 2, testing::join({{"--pipeline-model-parallel-size", "2"}, kV})},
      {"pp4", 4, testing::join({{"--pipeline-model-parallel-size", "4", "--num-layers", "8"}, kV})},
      {"pp2_dp2", 4, testing::join({{"--pipeline-model-parallel-size", "2"}, kV})},
      {"tp2_pp2_sp", 4,
       testing::join({{"--pipeline-model-parallel-size", "2", "--tensor-model-parallel-size", "2", "--sequence-parallel"},
                      kV})},
      {"cp2_pp2", 4, testing::join({{"--pipeline-model-parallel-size", "2", "--context-parallel-size", "2"}, kV})},
      {"pp2_dp2_distopt", 4,
       testing::join({{"--pipeline-model-parallel-size", "2", "--use-distributed-optimizer"}, kV})},
      {"pp2_dp2_distopt_overlap", 4,
       testing::join({{"--pipeline-model-parallel-size", "2", "--use-distributed-optimizer", "--overlap-grad-reduce",
                       "--overlap-param-gather"},
                      kV}),
       4096},
  };
  return all;
}

// 4 layers (8 with PP4), 8 micro-batches of 2 (4 per DP rank with DP2: 2·PP).
const std::vector<std::string>& kCommon = testing::kPipelineTestFlags;

class DualPipeVInvariance : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(DualPipeVInvariance, MatchesSingleProcess) {
  const auto& [name, llama] = GetParam();
  const std::vector<std::string> model = testing::join({kCommon, llama ? testing::kTinyLlama : testing::kTinyGpt});
  // The probe: a parameter of every rank (the layers' attention), whose gradients must match.
  testing::expect_layout_matches_single_process(layouts(), name, model, 3e-5, "linear_qkv.weight");
}

INSTANTIATE_TEST_SUITE_P(Layouts, DualPipeVInvariance,
                         ::testing::Combine(::testing::ValuesIn(testing::layout_names(layouts())), ::testing::Bool()),
                         testing::layout_model_test_name);

}  // namespace
}  // namespace gale
