// Parallel invariance of --qk-layernorm on standard attention (per-head q/k norms over head_dim,
// [HD] weights shared by every head): tensor parallelism (each rank norms its own heads, the norm
// weights' gradients all-reduced over TP), with sequence parallelism, pipeline parallelism, data
// parallelism with the distributed optimizer, full recomputation, context parallelism (ring with
// documents, Ulysses' head split) and flash attention reproduce the single-process run: losses and
// grad norms within 1e-5 relative, final parameters 1e-3 and final gradients 3e-5 (as
// tests/parallel/mla_invariance_mpi_test.cc; a missing reduction is off by O(1)).
#include <gtest/gtest.h>

#include "layout_invariance.h"

namespace gale {
namespace {

using testing::Layout;

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {"tp2", 2, {"--tensor-model-parallel-size", "2"}},
      {"tp2_sp", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
      {"dp2_distopt", 2, {"--use-distributed-optimizer"}},
      {"pp2", 2, {"--pipeline-model-parallel-size", "2"}},
      {"tp2_sp_full_recompute", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel",
                                    "--recompute-granularity", "full", "--recompute-method", "uniform",
                                    "--recompute-num-layers", "2"}},
      {"tp2_sp_flash", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}, 0, {}, true},
      {"cp2_docs", 2, {"--context-parallel-size", "2", "--reset-attention-mask"}},
      {"cp2_ulysses", 2, {"--context-parallel-size", "2", "--context-parallel-algo", "ulysses_cp_algo"}},
      {"tp2_cp2_sp", 4, {"--tensor-model-parallel-size", "2", "--context-parallel-size", "2", "--sequence-parallel"}},
      {"tp2_pp2_sp", 4, {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                         "--sequence-parallel"}},
  };
  return all;
}

const std::vector<std::string> kCommon = {
    "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "8", "--seq-length", "16",
    "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "5",
    "--lr", "2e-3", "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--mock-data",
    "--make-vocab-size-divisible-by", "64", "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--eval-iters",
    "0", "--log-interval", "1000", "--clip-grad", "0.5", "--qk-layernorm", "--position-embedding-type", "rope"};
// Qwen3-like (GQA 8/2, head_dim 12 unlike hidden/heads, RMSNorm, SwiGLU, no biases; half the head
// dims rotary) and GPT-like (MHA, LayerNorm with biases on the q/k norms too, every head dim rotary:
// the unrotated dims of k_layernorm.bias shift every score of a query alike, so their true gradient
// is 0 and AdamW would turn its rounding noise into steps of size lr, 2e-3 apart between layouts).
const std::vector<std::string> kQwen = {"--group-query-attention", "--num-query-groups", "2", "--kv-channels", "12",
                                        "--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear",
                                        "--untie-embeddings-and-output-weights", "--rotary-percent", "0.5"};
const std::vector<std::string> kGptLike = {};

class QkLayerNormInvariance : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(QkLayerNormInvariance, MatchesSingleProcess) {
  const auto& [name, qwen] = GetParam();
  // 3e-5 for gradients, as the MLA layouts: TP sums the heads' norm gradients in another order.
  testing::expect_layout_matches_single_process(layouts(), name, testing::join({kCommon, qwen ? kQwen : kGptLike}),
                                                3e-5, "q_layernorm.weight");
}

INSTANTIATE_TEST_SUITE_P(Layouts, QkLayerNormInvariance,
                         ::testing::Combine(::testing::ValuesIn(testing::layout_names(layouts())), ::testing::Bool()),
                         [](const auto& info) {
                           return std::get<0>(info.param) + (std::get<1>(info.param) ? "_qwen" : "_gpt");
                         });

}  // namespace
}  // namespace gale
