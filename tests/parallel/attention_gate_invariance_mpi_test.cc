// Parallel invariance of --attention-output-gate (each query head's gate rows inside its group's
// linear_qkv block): tensor parallelism (whole groups of q, gate, k, v rows per rank, with sequence
// parallelism), context parallelism (ring and Ulysses: the gate multiplies each rank's own tokens)
// and pipeline parallelism reproduce the single-process run: losses and grad norms within 1e-5
// relative, final parameters and gradients as tests/parallel/qk_layernorm_invariance_mpi_test.cc.
#include <gtest/gtest.h>

#include "layout_invariance.h"

namespace gale {
namespace {

using testing::Layout;

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {"tp2_sp_flash", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}, 0, {}, true},
      {"tp4", 4, {"--tensor-model-parallel-size", "4"}},
      {"cp2_flash", 2, {"--context-parallel-size", "2"}, 0, {}, true},
      {"cp2_ulysses", 2, {"--context-parallel-size", "2", "--context-parallel-algo", "ulysses_cp_algo"}},
      {"pp2", 2, {"--pipeline-model-parallel-size", "2"}},
  };
  return all;
}

// LLaMA-like: GQA 8/4, RMSNorm, SwiGLU, RoPE, no biases, the output gate, with attention dropout.
const std::vector<std::string> kCommon = {
    "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "8", "--seq-length", "16",
    "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "5",
    "--lr", "2e-3", "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--mock-data",
    "--make-vocab-size-divisible-by", "64", "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--eval-iters",
    "0", "--log-interval", "1000", "--clip-grad", "0.5", "--position-embedding-type", "rope",
    "--group-query-attention", "--num-query-groups", "4", "--normalization", "RMSNorm", "--swiglu",
    "--disable-bias-linear", "--untie-embeddings-and-output-weights", "--attention-output-gate"};

class AttentionGateInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(AttentionGateInvariance, MatchesSingleProcess) {
  testing::expect_layout_matches_single_process(layouts(), GetParam(), kCommon, 3e-5, "linear_qkv.weight");
}

INSTANTIATE_TEST_SUITE_P(Layouts, AttentionGateInvariance, ::testing::ValuesIn(testing::layout_names(layouts())),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace gale
