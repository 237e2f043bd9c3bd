// Parallel invariance of a hybrid Mamba model with multi-latent attention layers ('+', "M+-+";
// Megatron main's hybrid mla_layer): tensor parallelism (the MLA heads and the Mamba mixer split
// over TP), with sequence parallelism, with data parallelism and the distributed optimizer, pipeline
// parallelism, and context parallelism (the Mamba layers' all-to-alls, the MLA layers on ring
// attention, all-gather and Ulysses; with TP and SP) reproduce the single-process run: losses and
// grad norms within 1e-5 relative, final parameters 1e-3 and final gradients 3e-5 (as
// tests/parallel/hybrid_invariance_mpi_test.cc).
#include <gtest/gtest.h>

#include "layout_invariance.h"

namespace gale {
namespace {

using testing::Layout;

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {"tp2", 2, {"--tensor-model-parallel-size", "2"}},
      {"tp2_sp", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
      {"pp2", 2, {"--pipeline-model-parallel-size", "2"}},
      {"dp2_distopt", 2, {"--use-distributed-optimizer"}},
      {"cp2", 2, {"--context-parallel-size", "2"}},
      {"cp2_allgather", 2, {"--context-parallel-size", "2", "--cp-comm-type", "allgather"}},
      {"cp2_ulysses", 2, {"--context-parallel-size", "2", "--context-parallel-algo", "ulysses_cp_algo"}},
      {"tp4_sp", 4, {"--tensor-model-parallel-size", "4", "--sequence-parallel"}},
      {"tp2_cp2_sp", 4, {"--tensor-model-parallel-size", "2", "--context-parallel-size", "2", "--sequence-parallel"}},
      {"tp2_pp2_sp", 4, {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                         "--sequence-parallel"}},
  };
  return all;
}

// Hidden 64: d_inner 128, 8 heads of 16 in 4 groups (d_state 8); MLA of 8 heads, KV latent 12,
// Dn 6, R 4, Dv 5, a query latent of 10 or none; dropout on.
const std::vector<std::string> kHybridMla = {
    "--is-hybrid-model", "--hybrid-layer-pattern", "M+-+", "--hidden-size", "64", "--num-attention-heads", "8",
    "--mamba-state-dim", "8", "--mamba-head-dim", "16", "--mamba-num-groups", "4", "--kv-lora-rank", "12",
    "--qk-head-dim", "6", "--qk-pos-emb-head-dim", "4", "--v-head-dim", "5", "--seq-length", "16",
    "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "5",
    "--lr", "2e-3", "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--mock-data",
    "--make-vocab-size-divisible-by", "64", "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--eval-iters",
    "0", "--log-interval", "1000", "--clip-grad", "0.5", "--position-embedding-type", "rope"};

class HybridMlaInvariance : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(HybridMlaInvariance, MatchesSingleProcess) {
  const auto& [name, q_lora] = GetParam();
  std::vector<std::string> model = kHybridMla;
  if (q_lora) model.insert(model.end(), {"--q-lora-rank", "10", "--normalization", "RMSNorm", "--swiglu"});
  testing::expect_layout_matches_single_process(layouts(), name, model, 3e-5, "self_attention.linear_kv_down_proj");
}

INSTANTIATE_TEST_SUITE_P(Layouts, HybridMlaInvariance,
                         ::testing::Combine(::testing::ValuesIn(testing::layout_names(layouts())), ::testing::Bool()),
                         [](const auto& info) {
                           return std::get<0>(info.param) + (std::get<1>(info.param) ? "_q_lora" : "_direct");
                         });

}  // namespace
}  // namespace gale
