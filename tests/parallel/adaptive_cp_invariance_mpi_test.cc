// Parallel invariance of MindSpeed's adaptive context parallelism (--context-parallel-algo adaptive_cp_algo): ring attention over a layout chosen from the mask, its empty blocks skipped.
//
// Every layout reproduces the single-process run of the same model (GPT with 8 heads, LLaMA with
// GQA 8/4) and mask, with dropout on: losses and grad norms of 5 iterations within 1e-5 relative,
// final parameters and gradients as tests/parallel/invariance_mpi_test.cc (layout_invariance.h).
// The skipped blocks add exactly nothing, so the only differences from one process are those of
// any ring (the order of the online-softmax merges and of the gradient sums: fp32 rounding).
// Sequences of 32 positions; the masks:
//   documents (--reset-attention-mask; the test data's documents average 6 positions, so at CP4 the
//     first micro-batch's layout has 7 non-empty blocks of 16, Megatron's split 12), at CP2 and CP4,
//     on flash attention, with --adaptive-cp-only-reschedule (the sequence in order), TP2 + SP and
//     PP2 (every stage computes the same layouts), the double ring with the half key/value cache
//     (CP4, windows of 2), the full cache (CP2, in order: a block skipped), and hybrid_adaptive_cp_algo at CP4 with U = 2 (Ulysses
//     pairs, their rings of 2 adaptive; in order, the first ring rank's queries skip the second's block);
//   causal (nothing to skip at CP2: the layout balances the work) and --sliding-window 6 (a band;
//     7 of 16 blocks, Megatron's split 14) with --adaptive-cp-without-coarse.
#include <gtest/gtest.h>

#include <map>

#include "layout_invariance.h"

namespace gale {
namespace {

using testing::Layout;

const std::vector<std::string> kAdaptive = {"--context-parallel-algo", "adaptive_cp_algo",
                                            "--adaptive-cp-dynamic-attn-mask"};

std::vector<std::string> adaptive(int64_t cp, std::vector<std::string> more = {}) {
  std::vector<std::string> flags = testing::join({{"--context-parallel-size", std::to_string(cp)}, kAdaptive});
  flags.insert(flags.end(), more.begin(), more.end());
  return flags;
}

const std::vector<std::string> kDocs = {"--reset-attention-mask"};

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {"cp2_docs", 2, adaptive(2)},
      {"cp4_docs_flash", 4, adaptive(4), 0, {}, true},
      {"cp4_docs", 4, adaptive(4)},
      {"cp4_docs_only_reschedule", 4, adaptive(4, {"--adaptive-cp-only-reschedule"})},
      {"tp2_cp2_sp_docs", 4, adaptive(2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"})},
      {"pp2_cp2_docs", 4, adaptive(2, {"--pipeline-model-parallel-size", "2"})},
      {"cp4_docs_window2_kv_cache_half", 4, adaptive(4, {"--cp-window-size", "2", "--context-parallel-kv-cache-policy",
                                                         "half"})},
      {"cp2_docs_kv_cache_full", 2, adaptive(2, {"--adaptive-cp-only-reschedule", "--context-parallel-kv-cache-policy",
                                                 "full"})},
      {"cp4_hybrid_u2_docs", 4, {"--context-parallel-size", "4", "--context-parallel-algo", "hybrid_adaptive_cp_algo",
                                 "--ulysses-degree-in-cp", "2", "--adaptive-cp-dynamic-attn-mask"}},
      {"cp4_hybrid_u2_docs_only_reschedule", 4, {"--context-parallel-size", "4", "--context-parallel-algo",
                                                 "hybrid_adaptive_cp_algo", "--ulysses-degree-in-cp", "2",
                                                 "--adaptive-cp-dynamic-attn-mask", "--adaptive-cp-only-reschedule"}},
      {"cp2_causal", 2, {"--context-parallel-size", "2", "--context-parallel-algo", "adaptive_cp_algo"}},
      {"cp4_window6_without_coarse", 4, {"--context-parallel-size", "4", "--context-parallel-algo", "adaptive_cp_algo",
                                         "--adaptive-cp-without-coarse"}},
  };
  return all;
}

// The mask of each layout: flags of the model, so the single-process reference runs them too.
const std::map<std::string, std::vector<std::string>>& masks() {
  static const std::map<std::string, std::vector<std::string>> all = {
      {"cp2_docs", kDocs},
      {"cp4_docs_flash", kDocs},
      {"cp4_docs", kDocs},
      {"cp4_docs_only_reschedule", kDocs},
      {"tp2_cp2_sp_docs", kDocs},
      {"pp2_cp2_docs", kDocs},
      {"cp4_docs_window2_kv_cache_half", kDocs},
      {"cp2_docs_kv_cache_full", kDocs},
      {"cp4_hybrid_u2_docs", kDocs},
      {"cp4_hybrid_u2_docs_only_reschedule", kDocs},
      {"cp2_causal", {}},
      {"cp4_window6_without_coarse", {"--sliding-window", "6"}},
  };
  return all;
}

const std::vector<std::string> kCommon = {
    "--num-layers", "4", "--hidden-size", "64", "--seq-length", "32", "--max-position-embeddings", "32",
    "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "5", "--lr", "2e-3",
    "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--mock-data", "--make-vocab-size-divisible-by", "64",
    "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--eval-iters", "0", "--log-interval", "1000",
    "--clip-grad", "0.5"};

class AdaptiveCpInvariance : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(AdaptiveCpInvariance, MatchesSingleProcess) {
  const auto& [name, llama] = GetParam();
  testing::expect_layout_matches_single_process(
      layouts(), name, testing::join({kCommon, llama ? testing::kTinyLlama : testing::kTinyGpt, masks().at(name)}),
      1e-5, "linear_qkv.weight");
}

INSTANTIATE_TEST_SUITE_P(Layouts, AdaptiveCpInvariance,
                         ::testing::Combine(::testing::ValuesIn(testing::layout_names(layouts())), ::testing::Bool()),
                         testing::layout_model_test_name);

}  // namespace
}  // namespace gale
