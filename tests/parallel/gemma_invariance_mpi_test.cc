// Parallel invariance of a Gemma (v1) model from MindSpeed-LLM's flags (--gelu-tanh GeGLU,
// --add-rmsnorm-offset, --input-embeds-norm; train/arguments_gemma.cc) with Gemma's shape (head_dim
// 32 independent of hidden / heads = 8, multi-query attention, RoPE, tied embeddings, no biases):
// data, tensor+sequence and pipeline parallelism reproduce the single-process run (losses and grad
// norms, final parameters and gradients).
#include <gtest/gtest.h>

#include "layout_invariance.h"

namespace gale {
namespace {

using testing::Layout;

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {"dp2", 2, {}},
      {"tp2_sp", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
      {"pp2", 2, {"--pipeline-model-parallel-size", "2"}},
  };
  return all;
}

const std::vector<std::string> kModel = {
    "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "8", "--kv-channels", "32",
    "--group-query-attention", "--num-query-groups", "2", "--ffn-hidden-size", "96", "--seq-length", "16",
    "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "5",
    "--lr", "2e-3", "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--mock-data",
    "--make-vocab-size-divisible-by", "64", "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--eval-iters",
    "0", "--log-interval", "1000", "--clip-grad", "0.5", "--position-embedding-type", "rope", "--normalization",
    "RMSNorm", "--norm-epsilon", "1e-6", "--disable-bias-linear", "--gelu-tanh", "--add-rmsnorm-offset",
    "--input-embeds-norm", "--init-method-std", "0.01"};

class GemmaInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(GemmaInvariance, MatchesSingleProcess) {
  testing::expect_layout_matches_single_process(layouts(), GetParam(), kModel, 3e-5, "linear_fc1");
}

INSTANTIATE_TEST_SUITE_P(Layouts, GemmaInvariance, ::testing::ValuesIn(testing::layout_names(layouts())),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace gale
