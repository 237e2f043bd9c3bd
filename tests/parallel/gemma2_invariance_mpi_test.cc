// Parallel invariance of Gemma-2's layer features (--attn-logit-softcapping, --output-logit-softcapping,
// --query-pre-attn-scalar, --post-norm, --interleave-sliding-window): tensor parallelism (the LM head's
// vocabulary slices merged after the cap; with sequence parallelism the post norms' gradients
// all-reduced over TP; flash attention), context parallelism (ring attention's blocks of capped scores,
// Ulysses) and pipeline parallelism reproduce the single-process run: losses and grad norms, final
// parameters and gradients, the post norms' among them.
#include <gtest/gtest.h>

#include "layout_invariance.h"

namespace gale {
namespace {

using testing::Layout;

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {"tp2", 2, {"--tensor-model-parallel-size", "2"}},
      {"tp2_sp_flash", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}, 0, {}, true},
      {"cp2_ring_flash", 2, {"--context-parallel-size", "2"}, 0, {}, true},
      {"cp2_ulysses", 2, {"--context-parallel-size", "2", "--context-parallel-algo", "ulysses_cp_algo"}},
      {"pp2", 2, {"--pipeline-model-parallel-size", "2"}},
  };
  return all;
}

// Gemma-2-like: GQA 8/4, RMSNorm, SwiGLU, RoPE, no biases, both caps small enough to bite, a window of
// 5 in layers 1 and 3 (1-based) of 16 positions, with dropout.
const std::vector<std::string> kCommon = {
    "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "8", "--seq-length", "16",
    "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "5",
    "--lr", "2e-3", "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--mock-data",
    "--make-vocab-size-divisible-by", "64", "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--eval-iters",
    "0", "--log-interval", "1000", "--clip-grad", "0.5", "--position-embedding-type", "rope",
    "--group-query-attention", "--num-query-groups", "4", "--normalization", "RMSNorm", "--swiglu",
    "--disable-bias-linear", "--untie-embeddings-and-output-weights", "--attn-logit-softcapping", "0.5",
    "--output-logit-softcapping", "0.3", "--query-pre-attn-scalar", "3", "--post-norm",
    "--interleave-sliding-window", "5"};

class Gemma2Invariance : public ::testing::TestWithParam<std::string> {};

TEST_P(Gemma2Invariance, MatchesSingleProcess) {
  testing::expect_layout_matches_single_process(layouts(), GetParam(), kCommon, 3e-5, "post_attn_norm");
}

INSTANTIATE_TEST_SUITE_P(Layouts, Gemma2Invariance, ::testing::ValuesIn(testing::layout_names(layouts())),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace gale
