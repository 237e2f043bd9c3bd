// Parallel invariance of --qk-l2-norm (weightless per-head q/k L2 norms): tensor parallelism (each
// rank normalises its own heads), with sequence parallelism and flash attention, pipeline
// parallelism and context parallelism (ring with documents, Ulysses' head split) reproduce the
// single-process run: losses and grad norms within 1e-5 relative, final parameters 1e-3 and final
// gradients 3e-5 (as tests/parallel/qk_layernorm_invariance_mpi_test.cc).
#include <gtest/gtest.h>

#include "layout_invariance.h"

namespace gale {
namespace {

using testing::Layout;

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {"tp2", 2, {"--tensor-model-parallel-size", "2"}},
      {"tp2_sp", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
      {"tp2_sp_flash", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}, 0, {}, true},
      {"pp2", 2, {"--pipeline-model-parallel-size", "2"}},
      {"cp2_docs", 2, {"--context-parallel-size", "2", "--reset-attention-mask"}},
      {"cp2_ulysses", 2, {"--context-parallel-size", "2", "--context-parallel-algo", "ulysses_cp_algo"}},
  };
  return all;
}

// Llama-4-like: GQA 8/2, head_dim 12 unlike hidden/heads, RMSNorm, SwiGLU, no biases, half the head
// dims rotary.
const std::vector<std::string> kModel = {
    "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "8", "--seq-length", "16",
    "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "5",
    "--lr", "2e-3", "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--mock-data",
    "--make-vocab-size-divisible-by", "64", "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--eval-iters",
    "0", "--log-interval", "1000", "--clip-grad", "0.5", "--qk-l2-norm", "--position-embedding-type", "rope",
    "--group-query-attention", "--num-query-groups", "2", "--kv-channels", "12", "--normalization", "RMSNorm",
    "--swiglu", "--disable-bias-linear", "--untie-embeddings-and-output-weights", "--rotary-percent", "0.5"};

class QkL2NormInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(QkL2NormInvariance, MatchesSingleProcess) {
  testing::expect_layout_matches_single_process(layouts(), GetParam(), kModel, 3e-5, "linear_qkv.weight");
}

INSTANTIATE_TEST_SUITE_P(Layouts, QkL2NormInvariance, ::testing::ValuesIn(testing::layout_names(layouts())),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace gale
