// Parallel invariance of multi-latent attention models: tensor parallelism (the up projections
// split over heads, the down projections and latent norms replicated), with sequence parallelism
// (the down projections on each rank's S/TP tokens, their gradients summed over TP), pipeline
// parallelism (1F1B and interleaved), data parallelism with the distributed optimizer, full
// recomputation, context parallelism (ring, all-gather, Ulysses, hybrid) and flash attention reproduce the single-process run: losses and grad norms within
// 1e-5 relative, final parameters 1e-3 (as tests/parallel/invariance_mpi_test.cc), final gradients
// 3e-5: TP 4 with SP sums the latent gradients of four head groups in another order, which after
// five AdamW steps leaves the query projections' gradients up to 1.3e-5 off (1e-5 is exceeded only
// there; a missing reduction is off by O(1)).
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
      {"pp2_vpp2", 2, {"--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1"}},
      {"tp2_sp_full_recompute", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel",
                                    "--recompute-granularity", "full", "--recompute-method", "uniform",
                                    "--recompute-num-layers", "2"}},
      {"tp2_sp_flash", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}, 0, {}, true},
      // Context parallelism: the padded per-head q/k/v rows go through the ring (p2p, the default),
      // the all-gather and Ulysses' head split unchanged; MLA's RoPE at the chunks' global positions.
      {"cp2_docs", 2, {"--context-parallel-size", "2", "--reset-attention-mask"}},
      {"cp2_docs_flash", 2, {"--context-parallel-size", "2", "--reset-attention-mask"}, 0, {}, true},
      {"cp2_allgather", 2, {"--context-parallel-size", "2", "--cp-comm-type", "allgather"}},
      {"cp2_ulysses", 2, {"--context-parallel-size", "2", "--context-parallel-algo", "ulysses_cp_algo"}},
      {"tp2_cp2_sp", 4, {"--tensor-model-parallel-size", "2", "--context-parallel-size", "2", "--sequence-parallel"}},
      {"cp4_hybrid_u2", 4, {"--context-parallel-size", "4", "--context-parallel-algo", "hybrid_cp_algo",
                            "--ulysses-degree-in-cp", "2"}},
      // --recompute-modules mla_up_proj: the packed rows rebuilt in backward (under Ulysses with the
      // head split's all-to-all again).
      {"tp2_sp_recompute_mla_up_proj", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel",
                                           "--recompute-granularity", "selective", "--recompute-modules",
                                           "mla_up_proj", "mlp"}},
      {"cp2_ulysses_recompute_mla_up_proj", 2, {"--context-parallel-size", "2", "--context-parallel-algo",
                                                "ulysses_cp_algo", "--recompute-activations", "--recompute-modules",
                                                "mla_up_proj"}},
      {"tp4_sp", 4, {"--tensor-model-parallel-size", "4", "--sequence-parallel"}},
      {"tp2_pp2_sp", 4, {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                         "--sequence-parallel"}},
      {"tp2_sp_dp2_distopt", 4, {"--tensor-model-parallel-size", "2", "--sequence-parallel",
                                 "--use-distributed-optimizer"}},
  };
  return all;
}

const std::vector<std::string> kCommon = {
    "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "8", "--seq-length", "16",
    "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "5",
    "--lr", "2e-3", "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--mock-data",
    "--make-vocab-size-divisible-by", "64", "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--eval-iters",
    "0", "--log-interval", "1000", "--clip-grad", "0.5", "--multi-latent-attention", "--kv-lora-rank", "12",
    "--qk-head-dim", "6", "--qk-pos-emb-head-dim", "4", "--v-head-dim", "5"};
// DeepSeek-like (query latent, latent norms, RMSNorm, SwiGLU) and GPT-like (direct query projection
// with its fused norm of x, LayerNorm with biases, learned positions).
const std::vector<std::string> kDeepseek = {"--q-lora-rank", "10", "--qk-layernorm", "--normalization", "RMSNorm",
                                            "--swiglu", "--position-embedding-type", "rope", "--disable-bias-linear",
                                            "--untie-embeddings-and-output-weights"};
const std::vector<std::string> kGptLike = {"--qk-layernorm"};

class MlaInvariance : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(MlaInvariance, MatchesSingleProcess) {
  const auto& [name, deepseek] = GetParam();
  // 3e-5 for gradients: TP4 sums four head groups in another order (1.3e-5 after five AdamW steps).
  testing::expect_layout_matches_single_process(layouts(), name, testing::join({kCommon, deepseek ? kDeepseek : kGptLike}),
                                                3e-5, "linear_kv_down_proj");
}

INSTANTIATE_TEST_SUITE_P(Layouts, MlaInvariance,
                         ::testing::Combine(::testing::ValuesIn(testing::layout_names(layouts())), ::testing::Bool()),
                         [](const auto& info) {
                           return std::get<0>(info.param) + (std::get<1>(info.param) ? "_deepseek" : "_gpt");
                         });

}  // namespace
}  // namespace gale
