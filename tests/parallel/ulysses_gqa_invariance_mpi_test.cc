// Parallel invariance of Ulysses context parallelism with fewer query groups than ranks (the repeat all-to-all) and of --use-ulysses-allgather-kv.
//
// A LLaMA-style model with 8 heads in 2 query groups (GQA) or 1 (MQA), dropout on: every layout
// reproduces the single-process run (losses and grad norms of 5 iterations within 1e-5 relative,
// final parameters and gradients as tests/parallel/invariance_mpi_test.cc).
//   repeat: CP 4 with 2 groups and TP2·CP2 + SP with 1 group per TP rank (each group's key and value
//     go to the 2 ranks of its heads), CP 4 with MQA, hybrid CP4·U2 with MQA (repeat, then the ring);
//     CP 2 with 2 groups is the whole-groups control.
//   --use-ulysses-allgather-kv: CP 2 (documents) and CP 4 (flash attention) with MQA, TP2·CP2 + SP
//     with 2 groups (one per TP rank).
// A key/value gradient summed into the wrong group, or a query head paired with the wrong group's
// key, moves the losses far beyond the tolerance.
#include <gtest/gtest.h>

#include "layout_invariance.h"

namespace gale {
namespace {

using testing::Layout;

const std::vector<Layout>& gqa2_layouts() {
  static const std::vector<Layout> all = {
      {"cp2_ulysses", 2, {"--context-parallel-size", "2", "--context-parallel-algo", "ulysses_cp_algo"}},
      {"cp4_ulysses_repeat_docs", 4, {"--context-parallel-size", "4", "--context-parallel-algo", "ulysses_cp_algo",
                                      "--reset-attention-mask"}},
      {"tp2_cp2_ulysses_repeat_sp", 4, {"--tensor-model-parallel-size", "2", "--context-parallel-size", "2",
                                        "--context-parallel-algo", "ulysses_cp_algo", "--sequence-parallel"}},
      {"tp2_cp2_ulysses_allgather_kv_sp", 4, {"--tensor-model-parallel-size", "2", "--context-parallel-size", "2",
                                              "--context-parallel-algo", "ulysses_cp_algo", "--sequence-parallel",
                                              "--use-ulysses-allgather-kv"}},
  };
  return all;
}

const std::vector<Layout>& mqa_layouts() {
  static const std::vector<Layout> all = {
      {"cp4_ulysses_repeat", 4, {"--context-parallel-size", "4", "--context-parallel-algo", "ulysses_cp_algo"}},
      {"cp4_hybrid_u2_repeat", 4, {"--context-parallel-size", "4", "--context-parallel-algo", "hybrid_cp_algo",
                                   "--ulysses-degree-in-cp", "2"}},
      {"cp2_ulysses_allgather_kv_docs", 2, {"--context-parallel-size", "2", "--context-parallel-algo",
                                            "ulysses_cp_algo", "--use-ulysses-allgather-kv",
                                            "--reset-attention-mask"}},
      {"cp4_ulysses_allgather_kv_flash", 4, {"--context-parallel-size", "4", "--context-parallel-algo",
                                             "ulysses_cp_algo", "--use-ulysses-allgather-kv"}, 0, {}, true},
  };
  return all;
}

std::vector<std::string> model(const char* groups) {
  return {"--num-layers", "4", "--hidden-size", "64", "--seq-length", "16", "--max-position-embeddings", "16",
          "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "5", "--lr", "2e-3",
          "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--mock-data", "--make-vocab-size-divisible-by", "64",
          "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--eval-iters", "0", "--log-interval", "1000",
          "--clip-grad", "0.5", "--num-attention-heads", "8", "--group-query-attention", "--num-query-groups", groups,
          "--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope", "--disable-bias-linear",
          "--untie-embeddings-and-output-weights"};
}

class UlyssesGqa2Invariance : public ::testing::TestWithParam<std::string> {};
class UlyssesMqaInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(UlyssesGqa2Invariance, MatchesSingleProcess) {
  testing::expect_layout_matches_single_process(gqa2_layouts(), GetParam(), model("2"), 1e-5, "linear_qkv.weight");
}

TEST_P(UlyssesMqaInvariance, MatchesSingleProcess) {
  testing::expect_layout_matches_single_process(mqa_layouts(), GetParam(), model("1"), 1e-5, "linear_qkv.weight");
}

INSTANTIATE_TEST_SUITE_P(Layouts, UlyssesGqa2Invariance, ::testing::ValuesIn(testing::layout_names(gqa2_layouts())));
INSTANTIATE_TEST_SUITE_P(Layouts, UlyssesMqaInvariance, ::testing::ValuesIn(testing::layout_names(mqa_layouts())));

}  // namespace
}  // namespace gale
