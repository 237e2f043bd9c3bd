// Parallel invariance of Megatron main's gpt-oss activation (--quick-geglu --glu-linear-offset 1
// --activation-func-clamp-value; model/mlp_activation.h) in a tiny MoE model with grouped-GEMM experts,
// a shared expert and a dense layer: tensor+sequence parallelism (each rank's fc1 holds its slice of
// the gate rows and of the linear rows), expert parallelism (all-to-all), pipeline and data parallelism
// reproduce the single-process run: losses and grad norms (1e-5), final parameters and gradients.
// The clamp is 0.1 so that it binds in a model of init std 0.02 (fc1 outputs of about ±0.2).
#include <gtest/gtest.h>

#include "layout_invariance.h"

namespace gale {
namespace {

using testing::Layout;

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {"dp2", 2, {}},
      {"tp2_sp", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
      {"ep2", 2, {"--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall"}},
      {"pp2", 2, {"--pipeline-model-parallel-size", "2"}},
      {"tp2_sp_ep2", 4, {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--expert-model-parallel-size",
                         "2", "--moe-token-dispatcher-type", "alltoall"}},
  };
  return all;
}

// gpt-oss-like: GQA 8/4, RMSNorm, RoPE, no biases, untied output, quick GeGLU with offset 1 and a clamp
// in the dense layer 2, the experts of layers 0, 1, 3 (grouped GEMM) and their shared expert.
const std::vector<std::string> kModel = {
    "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "8", "--seq-length", "16",
    "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "5",
    "--lr", "2e-3", "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--mock-data",
    "--make-vocab-size-divisible-by", "64", "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--eval-iters",
    "0", "--log-interval", "1000", "--clip-grad", "0.5", "--position-embedding-type", "rope",
    "--group-query-attention", "--num-query-groups", "4", "--normalization", "RMSNorm", "--disable-bias-linear",
    "--untie-embeddings-and-output-weights", "--quick-geglu", "--glu-linear-offset", "1.0",
    "--activation-func-clamp-value", "0.1", "--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size",
    "48", "--moe-layer-freq", "[1,1,0,1]", "--moe-aux-loss-coeff", "0.1", "--moe-shared-expert-intermediate-size",
    "32", "--moe-grouped-gemm"};

class QuickGegluInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(QuickGegluInvariance, MatchesSingleProcess) {
  testing::expect_layout_matches_single_process(layouts(), GetParam(), kModel, 3e-5, "linear_fc1");
}

INSTANTIATE_TEST_SUITE_P(Layouts, QuickGegluInvariance, ::testing::ValuesIn(testing::layout_names(layouts())),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace gale
