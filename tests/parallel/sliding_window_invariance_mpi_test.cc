// Parallel invariance of --sliding-window (window 5 over 16 positions, so every layout's blocks
// mix visible, partly hidden and wholly hidden keys): context parallelism (ring attention with and
// without documents, rings of 2 and 4, all-gathered keys, Ulysses, the Ulysses x ring hybrid, with
// the reference and the flash kernel) sees the window at global positions, and tensor, sequence
// and pipeline parallelism reproduce the single-process run: losses and grad norms within 1e-5
// relative, final parameters and gradients as tests/parallel/qk_layernorm_invariance_mpi_test.cc.
#include <gtest/gtest.h>

#include "layout_invariance.h"

namespace gale {
namespace {

using testing::Layout;

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {"cp2", 2, {"--context-parallel-size", "2"}},
      {"cp2_docs", 2, {"--context-parallel-size", "2", "--reset-attention-mask"}},
      {"cp2_docs_flash", 2, {"--context-parallel-size", "2", "--reset-attention-mask"}, 0, {}, true},
      {"cp2_allgather_flash", 2, {"--context-parallel-size", "2", "--cp-comm-type", "allgather"}, 0, {}, true},
      {"cp2_ulysses_docs", 2, {"--context-parallel-size", "2", "--context-parallel-algo", "ulysses_cp_algo",
                               "--reset-attention-mask"}},
      {"tp2_sp_flash", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}, 0, {}, true},
      {"pp2", 2, {"--pipeline-model-parallel-size", "2"}},
      {"cp4", 4, {"--context-parallel-size", "4"}},
      {"cp4_docs_flash", 4, {"--context-parallel-size", "4", "--reset-attention-mask"}, 0, {}, true},
      {"cp4_hybrid_u2_docs", 4, {"--context-parallel-size", "4", "--context-parallel-algo", "hybrid_cp_algo",
                                 "--ulysses-degree-in-cp", "2", "--reset-attention-mask"}},
      {"tp2_cp2_sp", 4, {"--tensor-model-parallel-size", "2", "--context-parallel-size", "2", "--sequence-parallel"}},
  };
  return all;
}

// LLaMA-like: GQA 8/4, RMSNorm, SwiGLU, RoPE, no biases, with attention dropout.
const std::vector<std::string> kCommon = {
    "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "8", "--seq-length", "16",
    "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "5",
    "--lr", "2e-3", "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--mock-data",
    "--make-vocab-size-divisible-by", "64", "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--eval-iters",
    "0", "--log-interval", "1000", "--clip-grad", "0.5", "--position-embedding-type", "rope",
    "--group-query-attention", "--num-query-groups", "4", "--normalization", "RMSNorm", "--swiglu",
    "--disable-bias-linear", "--untie-embeddings-and-output-weights", "--sliding-window", "5"};

class SlidingWindowInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(SlidingWindowInvariance, MatchesSingleProcess) {
  testing::expect_layout_matches_single_process(layouts(), GetParam(), kCommon, 3e-5, "linear_qkv.weight");
}

INSTANTIATE_TEST_SUITE_P(Layouts, SlidingWindowInvariance, ::testing::ValuesIn(testing::layout_names(layouts())),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace gale
