// Parallel invariance of --position-embedding-type alibi (8 heads, GQA 8/4, so every TP or Ulysses
// rank holds heads with other slopes): tensor parallelism (each rank's heads read their slopes at
// their global index), context parallelism (ring attention with and without documents, all-gathered
// keys, Ulysses, the Ulysses x ring hybrid: the bias at global positions), with a sliding window,
// sequence and pipeline parallelism, with the reference and the flash kernel, reproduce the
// single-process run: losses and grad norms within 1e-5 relative, final parameters and gradients
// as tests/parallel/sliding_window_invariance_mpi_test.cc. A Bloom-shaped model (--embed-layernorm,
// LayerNorm, biases, tied embeddings, tanh GeLU) checks the embedding norm under TP, SP (its rows
// split, its gradient summed over the TP group), CP and PP (the tied embedding on two stages).
#include <gtest/gtest.h>

#include "layout_invariance.h"

namespace gale {
namespace {

using testing::Layout;

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {"tp2", 2, {"--tensor-model-parallel-size", "2"}},
      {"tp2_sp_flash", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}, 0, {}, true},
      {"cp2", 2, {"--context-parallel-size", "2"}},
      {"cp2_docs_flash", 2, {"--context-parallel-size", "2", "--reset-attention-mask"}, 0, {}, true},
      {"cp2_window_flash", 2, {"--context-parallel-size", "2", "--sliding-window", "5"}, 0, {}, true},
      {"cp2_allgather_flash", 2, {"--context-parallel-size", "2", "--cp-comm-type", "allgather"}, 0, {}, true},
      {"cp2_ulysses_docs", 2, {"--context-parallel-size", "2", "--context-parallel-algo", "ulysses_cp_algo",
                               "--reset-attention-mask"}},
      {"pp2", 2, {"--pipeline-model-parallel-size", "2"}},
      {"cp4_docs_flash", 4, {"--context-parallel-size", "4", "--reset-attention-mask"}, 0, {}, true},
      {"cp4_hybrid_u2_docs", 4, {"--context-parallel-size", "4", "--context-parallel-algo", "hybrid_cp_algo",
                                 "--ulysses-degree-in-cp", "2", "--reset-attention-mask"}},
      {"tp2_cp2_sp", 4, {"--tensor-model-parallel-size", "2", "--context-parallel-size", "2", "--sequence-parallel"}},
      {"tp4", 4, {"--tensor-model-parallel-size", "4"}},
  };
  return all;
}

// LLaMA-like without RoPE: GQA 8/4, RMSNorm, SwiGLU, ALiBi, no biases, with attention dropout.
const std::vector<std::string> kCommon = {
    "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "8", "--seq-length", "16",
    "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "5",
    "--lr", "2e-3", "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--mock-data",
    "--make-vocab-size-divisible-by", "64", "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--eval-iters",
    "0", "--log-interval", "1000", "--clip-grad", "0.5", "--position-embedding-type", "alibi",
    "--group-query-attention", "--num-query-groups", "4", "--normalization", "RMSNorm", "--swiglu",
    "--disable-bias-linear", "--untie-embeddings-and-output-weights"};

class AlibiInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(AlibiInvariance, MatchesSingleProcess) {
  testing::expect_layout_matches_single_process(layouts(), GetParam(), kCommon, 3e-5, "linear_qkv.weight");
}

INSTANTIATE_TEST_SUITE_P(Layouts, AlibiInvariance, ::testing::ValuesIn(testing::layout_names(layouts())),
                         [](const auto& info) { return info.param; });

// Bloom-shaped: MHA, LayerNorm with the embedding norm, linear biases, tied embeddings, tanh GeLU.
const std::vector<std::string> kBloom = {
    "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "8", "--seq-length", "16",
    "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "5",
    "--lr", "2e-3", "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--mock-data",
    "--make-vocab-size-divisible-by", "64", "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--eval-iters",
    "0", "--log-interval", "1000", "--clip-grad", "0.5", "--position-embedding-type", "alibi", "--embed-layernorm",
    "--openai-gelu"};

class BloomInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(BloomInvariance, MatchesSingleProcess) {
  testing::expect_layout_matches_single_process(layouts(), GetParam(), kBloom, 3e-5, "linear_qkv.weight");
}

INSTANTIATE_TEST_SUITE_P(Layouts, BloomInvariance,
                         ::testing::Values("tp2", "tp2_sp_flash", "cp2_docs_flash", "pp2", "tp2_cp2_sp", "tp4"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace gale
