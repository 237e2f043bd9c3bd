// Parallel invariance of MindSpeed's context-parallel extensions: kvallgather_cp_algo, the double ring (--cp-window-size) and the ring's key/value cache.
//
// Every layout reproduces the single-process run of the same model (GPT with 8 heads, LLaMA with
// GQA 8/4), with dropout on: losses and grad norms of 5 iterations within 1e-5 relative, final
// parameters and gradients as tests/parallel/invariance_mpi_test.cc (layout_invariance.h).
//   kvallgather_cp_algo: keys and values all-gathered over CP 2 and 4 (with documents; CP4 on flash
//     attention) and TP2 + SP.
//   --cp-window-size 2: rings of 4 (CP 4, and hybrid_cp_algo's rings of 4 at CP 8) in two windows,
//     with documents, flash attention and TP2 + SP.
//   --context-parallel-kv-cache-policy full / half (with --context-parallel-cache-interval 1: layers
//     0 and 2 cached): CP 2 and 4, the double ring, TP2 + SP, PP2 (global layer numbers) and hybrid.
#include <gtest/gtest.h>

#include "layout_invariance.h"

namespace gale {
namespace {

using testing::Layout;

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      // kvallgather_cp_algo
      {"cp2_kvallgather_docs", 2, {"--context-parallel-size", "2", "--context-parallel-algo", "kvallgather_cp_algo",
                                   "--reset-attention-mask"}},
      {"cp4_kvallgather_docs_flash", 4, {"--context-parallel-size", "4", "--context-parallel-algo",
                                         "kvallgather_cp_algo", "--reset-attention-mask"}, 0, {}, true},
      {"tp2_cp2_kvallgather_sp", 4, {"--tensor-model-parallel-size", "2", "--context-parallel-size", "2",
                                     "--context-parallel-algo", "kvallgather_cp_algo", "--sequence-parallel"}},
      // --cp-window-size (double ring)
      {"cp4_window2", 4, {"--context-parallel-size", "4", "--cp-window-size", "2"}},
      {"cp4_window2_docs_flash", 4, {"--context-parallel-size", "4", "--cp-window-size", "2",
                                     "--reset-attention-mask"}, 0, {}, true},
      {"tp2_cp4_window2_sp", 8, {"--tensor-model-parallel-size", "2", "--context-parallel-size", "4",
                                 "--cp-window-size", "2", "--sequence-parallel"}},
      {"cp8_hybrid_u2_window2_docs", 8, {"--context-parallel-size", "8", "--context-parallel-algo", "hybrid_cp_algo",
                                         "--ulysses-degree-in-cp", "2", "--cp-window-size", "2",
                                         "--reset-attention-mask"}},
      // --context-parallel-kv-cache-policy (and --context-parallel-cache-interval)
      {"cp2_kv_cache_full", 2, {"--context-parallel-size", "2", "--context-parallel-kv-cache-policy", "full"}},
      {"cp2_kv_cache_half_docs", 2, {"--context-parallel-size", "2", "--context-parallel-kv-cache-policy", "half",
                                     "--reset-attention-mask"}},
      {"cp4_kv_cache_half", 4, {"--context-parallel-size", "4", "--context-parallel-kv-cache-policy", "half"}},
      {"cp4_window2_kv_cache_full_interval1", 4, {"--context-parallel-size", "4", "--cp-window-size", "2",
                                                  "--context-parallel-kv-cache-policy", "full",
                                                  "--context-parallel-cache-interval", "1"}},
      {"tp2_cp2_sp_kv_cache_half_flash", 4, {"--tensor-model-parallel-size", "2", "--context-parallel-size", "2",
                                             "--sequence-parallel", "--context-parallel-kv-cache-policy", "half"},
       0, {}, true},
      {"pp2_cp2_kv_cache_full_interval1", 4, {"--pipeline-model-parallel-size", "2", "--context-parallel-size", "2",
                                              "--context-parallel-kv-cache-policy", "full",
                                              "--context-parallel-cache-interval", "1"}},
      {"cp4_hybrid_u2_kv_cache_half", 4, {"--context-parallel-size", "4", "--context-parallel-algo", "hybrid_cp_algo",
                                          "--ulysses-degree-in-cp", "2", "--context-parallel-kv-cache-policy", "half"}},
  };
  return all;
}

const std::vector<std::string> kCommon = {
    "--num-layers", "4", "--hidden-size", "64", "--seq-length", "16", "--max-position-embeddings", "16",
    "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "5", "--lr", "2e-3",
    "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--mock-data", "--make-vocab-size-divisible-by", "64",
    "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--eval-iters", "0", "--log-interval", "1000",
    "--clip-grad", "0.5"};

class CpExtensionsInvariance : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(CpExtensionsInvariance, MatchesSingleProcess) {
  const auto& [name, llama] = GetParam();
  testing::expect_layout_matches_single_process(layouts(), name,
                                                testing::join({kCommon, llama ? testing::kTinyLlama : testing::kTinyGpt}),
                                                1e-5, "linear_qkv.weight");
}

INSTANTIATE_TEST_SUITE_P(Layouts, CpExtensionsInvariance,
                         ::testing::Combine(::testing::ValuesIn(testing::layout_names(layouts())), ::testing::Bool()),
                         testing::layout_model_test_name);

}  // namespace
}  // namespace gale
