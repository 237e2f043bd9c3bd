// Parallel invariance of Gated DeltaNet (--experimental-attention-variant gdn, layers 0 and 2 GDN,
// 1 and 3 full attention): tensor parallelism (in_proj column-parallel with its q|k|v|z|b|a sections
// split each on its own, conv1d split with q|k|v, dt_bias and A_log by value head, out_norm replicated
// with its gradient summed over TP, out_proj row-parallel), with and without sequence parallelism, at
// TP 2 and 4, with full recomputation, with pipeline parallelism, with context parallelism (CP 2,
// TP 2 × CP 2 with SP: the all-to-alls to a head split and the CP-local parameter slices), and with
// the linears' chunked TP overlap (--use-ascend-coc: 4 chunks) or MC2 linears (--use-ascend-mc2: the input gathered again in
// backward; their OpTable settings, as tests/parallel/coc_invariance_mpi_test.cc resolves them from
// the flags), reproduces the single-process
// run: losses and grad norms within 1e-5 relative, final parameters 1e-3 and final gradients 3e-5
// relative (the TP all-reduces sum in another order; a wrong split or a missing reduction is off by O(1)).
#include <gtest/gtest.h>

#include "layout_invariance.h"

namespace gale {
namespace {

using testing::Layout;

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {"tp2", 2, {"--tensor-model-parallel-size", "2"}},
      {"tp2_sp", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
      {"tp2_sp_full_recompute", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel",
                                    "--recompute-granularity", "full", "--recompute-method", "uniform",
                                    "--recompute-num-layers", "2"}},
      {"tp4", 4, {"--tensor-model-parallel-size", "4"}},
      {"tp4_sp", 4, {"--tensor-model-parallel-size", "4", "--sequence-parallel"}},
      {"tp2_pp2_sp", 4, {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                         "--sequence-parallel"}},
      // Context parallelism (model/gdn_context_parallel.h): the all-to-all to a head split, CP-local
      // conv1d / A_log / dt_bias slices; alone and with TP 2 and SP (TP·CP = 4 = the key heads).
      {"cp2", 2, {"--context-parallel-size", "2"}},
      {"tp2_cp2_sp", 4, {"--tensor-model-parallel-size", "2", "--context-parallel-size", "2", "--sequence-parallel"}},
  };
  return all;
}

// 4 key heads of 8 and 8 value heads of 6 (TP 4: one key head and two value heads per rank), a
// convolution of width 3; dropout on.
const std::vector<std::string> kGdn = {
    "--experimental-attention-variant", "gdn", "--linear-attention-freq", "2", "--linear-num-key-heads", "4",
    "--linear-num-value-heads", "8", "--linear-key-head-dim", "8", "--linear-value-head-dim", "6",
    "--linear-conv-kernel-dim", "3", "--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4",
    "--swiglu", "--normalization", "RMSNorm", "--disable-bias-linear", "--position-embedding-type", "rope",
    "--seq-length", "16", "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "8",
    "--train-iters", "5", "--lr", "2e-3", "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--mock-data",
    "--make-vocab-size-divisible-by", "64", "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--eval-iters",
    "0", "--log-interval", "1000", "--clip-grad", "0.5"};

class GdnInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(GdnInvariance, MatchesSingleProcess) {
  testing::expect_layout_matches_single_process(layouts(), GetParam(), kGdn, 3e-5, "self_attention.in_proj.weight");
}

INSTANTIATE_TEST_SUITE_P(Layouts, GdnInvariance, ::testing::ValuesIn(testing::layout_names(layouts())),
                         [](const auto& info) { return info.param; });

// TP 2 with SP through the TP linears' overlapped forms (model/tp_linear.h).
struct Overlap {
  const char* name;
  int chunks;     // OpTable::tp_comm_chunks
  bool regather;  // OpTable::tp_regather_input
};

class GdnTpOverlap : public ::testing::TestWithParam<Overlap> {};

TEST_P(GdnTpOverlap, MatchesSingleProcess) {
  if (test::world()->size() != 2) GTEST_SKIP() << "needs 2 ranks";
  const Overlap& o = GetParam();
  const testing::TestRun& reference = testing::single_process_run(kGdn, false, 5);
  OpTable ops = reference_ops();
  ops.tp_comm_chunks = o.chunks;
  ops.tp_regather_input = o.regather;
  testing::TestRun run(testing::join({kGdn, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}}),
                       test::world(), testing::kTinyVocab, EngineOptions{}, ops);
  run.train(5);
  finish_param_sync(*run.engine);
  EXPECT_GT(testing::expect_matches_reference(run, reference, 5, 3e-5, "self_attention.in_proj.weight"), 0);
}

INSTANTIATE_TEST_SUITE_P(Linears, GdnTpOverlap,
                         ::testing::Values(Overlap{"coc4", 4, false}, Overlap{"mc2", 2, true}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace gale
