// Parallel invariance of --softmax-type learnable (attention sinks: one learned logit per query head,
// core_attention.softmax_offset split over TP with the heads): tensor parallelism (with sequence
// parallelism and flash attention), context parallelism (ring: the sink folded in once after the
// blocks' merge; all-gather; Ulysses: each cp rank's heads read their slice of the logits; hybrid
// Ulysses × ring) and pipeline parallelism reproduce the single-process run: losses and grad norms,
// final parameters and gradients (the sink logits' among them) as the other invariance suites; and the
// same for a hybrid Mamba model's attention layers and for multi-latent attention.
#include <gtest/gtest.h>

#include "layout_invariance.h"

namespace gale {
namespace {

using testing::Layout;

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {"tp2", 2, {"--tensor-model-parallel-size", "2"}},
      {"tp2_sp_flash", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}, 0, {}, true},
      {"tp4", 4, {"--tensor-model-parallel-size", "4"}},
      {"cp2_ring_flash", 2, {"--context-parallel-size", "2"}, 0, {}, true},
      {"cp2_docs_ring", 2, {"--context-parallel-size", "2", "--reset-attention-mask"}},
      {"cp2_allgather", 2, {"--context-parallel-size", "2", "--cp-comm-type", "allgather"}},
      {"cp2_ulysses", 2, {"--context-parallel-size", "2", "--context-parallel-algo", "ulysses_cp_algo"}},
      {"tp2_cp2_ulysses_sp", 4, {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--context-parallel-size",
                                 "2", "--context-parallel-algo", "ulysses_cp_algo"}},
      {"cp4_hybrid_u2", 4, {"--context-parallel-size", "4", "--context-parallel-algo", "hybrid_cp_algo",
                            "--ulysses-degree-in-cp", "2"}},
      {"pp2", 2, {"--pipeline-model-parallel-size", "2"}},
  };
  return all;
}

// LLaMA-like: GQA 8/4, RMSNorm, SwiGLU, RoPE, no biases, learnable sinks, with attention dropout.
const std::vector<std::string> kCommon = {
    "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "8", "--seq-length", "16",
    "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "5",
    "--lr", "2e-3", "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--mock-data",
    "--make-vocab-size-divisible-by", "64", "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--eval-iters",
    "0", "--log-interval", "1000", "--clip-grad", "0.5", "--position-embedding-type", "rope",
    "--group-query-attention", "--num-query-groups", "4", "--normalization", "RMSNorm", "--swiglu",
    "--disable-bias-linear", "--untie-embeddings-and-output-weights", "--softmax-type", "learnable"};

class SoftmaxTypeInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(SoftmaxTypeInvariance, MatchesSingleProcess) {
  testing::expect_layout_matches_single_process(layouts(), GetParam(), kCommon, 3e-5,
                                                "self_attention.core_attention.softmax_offset");
}

INSTANTIATE_TEST_SUITE_P(Layouts, SoftmaxTypeInvariance, ::testing::ValuesIn(testing::layout_names(layouts())),
                         [](const auto& info) { return info.param; });

// A hybrid Mamba model's attention layers ('*' of M * - *: one on each PP 2 stage) with learnable
// sinks: TP 2 with SP, CP 2 (ring, Ulysses) and PP 2.
const std::vector<Layout>& hybrid_layouts() {
  static const std::vector<Layout> all = {
      {"hybrid_tp2_sp", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
      {"hybrid_cp2", 2, {"--context-parallel-size", "2"}},
      {"hybrid_cp2_ulysses", 2, {"--context-parallel-size", "2", "--context-parallel-algo", "ulysses_cp_algo"}},
      {"hybrid_pp2", 2, {"--pipeline-model-parallel-size", "2"}},
  };
  return all;
}

const std::vector<std::string> kHybrid = {
    "--is-hybrid-model", "--hybrid-override-pattern", "M*-*", "--num-layers", "4", "--hidden-size", "64",
    "--num-attention-heads", "8", "--mamba-state-dim", "8", "--mamba-head-dim", "16", "--mamba-num-groups", "4",
    "--seq-length", "16", "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "8",
    "--train-iters", "5", "--lr", "2e-3", "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--mock-data",
    "--make-vocab-size-divisible-by", "64", "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--eval-iters",
    "0", "--log-interval", "1000", "--clip-grad", "0.5", "--position-embedding-type", "rope", "--normalization",
    "RMSNorm", "--swiglu", "--disable-bias-linear", "--softmax-type", "learnable"};

class HybridSoftmaxTypeInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(HybridSoftmaxTypeInvariance, MatchesSingleProcess) {
  testing::expect_layout_matches_single_process(hybrid_layouts(), GetParam(), kHybrid, 3e-5,
                                                "self_attention.core_attention.softmax_offset");
}

INSTANTIATE_TEST_SUITE_P(Layouts, HybridSoftmaxTypeInvariance,
                         ::testing::ValuesIn(testing::layout_names(hybrid_layouts())),
                         [](const auto& info) { return info.param; });

// DeepSeek-like multi-latent attention (query latent, latent norms) with learnable sinks: TP 2 with SP
// and flash, TP 4, CP 2 (ring with documents, Ulysses) and PP 2.
const std::vector<Layout>& mla_layouts() {
  static const std::vector<Layout> all = {
      {"mla_tp2_sp_flash", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}, 0, {}, true},
      {"mla_tp4", 4, {"--tensor-model-parallel-size", "4"}},
      {"mla_cp2_docs", 2, {"--context-parallel-size", "2", "--reset-attention-mask"}},
      {"mla_cp2_ulysses", 2, {"--context-parallel-size", "2", "--context-parallel-algo", "ulysses_cp_algo"}},
      {"mla_pp2", 2, {"--pipeline-model-parallel-size", "2"}},
  };
  return all;
}

const std::vector<std::string> kMla = {
    "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "8", "--seq-length", "16",
    "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "5",
    "--lr", "2e-3", "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--mock-data",
    "--make-vocab-size-divisible-by", "64", "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--eval-iters",
    "0", "--log-interval", "1000", "--clip-grad", "0.5", "--multi-latent-attention", "--kv-lora-rank", "12",
    "--qk-head-dim", "6", "--qk-pos-emb-head-dim", "4", "--v-head-dim", "5", "--q-lora-rank", "10", "--qk-layernorm",
    "--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope", "--disable-bias-linear",
    "--untie-embeddings-and-output-weights", "--softmax-type", "learnable"};

class MlaSoftmaxTypeInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(MlaSoftmaxTypeInvariance, MatchesSingleProcess) {
  testing::expect_layout_matches_single_process(mla_layouts(), GetParam(), kMla, 3e-5,
                                                "self_attention.core_attention.softmax_offset");
}

INSTANTIATE_TEST_SUITE_P(Layouts, MlaSoftmaxTypeInvariance, ::testing::ValuesIn(testing::layout_names(mla_layouts())),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace gale
