// Parallel invariance of the hybrid Mamba model (--is-hybrid-model, pattern "M*-M"): tensor
// parallelism (in_proj column-parallel with its z|x|B|C|dt parts split each on its own, conv1d,
// A_log, D, dt_bias and the gated norm split by head and group, out_proj row-parallel), with
// sequence parallelism, TP 4, TP with data and with pipeline parallelism, and recomputation
// reproduce the single-process run: losses and grad norms within 1e-5 relative, final parameters
// 1e-3 and final gradients 3e-5 relative (the TP all-reduces and the pre-norm's SP gradient
// reduction sum in another order; a wrong split or a missing reduction is off by O(1)).
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
      {"tp2_sp_full_recompute", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel",
                                    "--recompute-granularity", "full", "--recompute-method", "uniform",
                                    "--recompute-num-layers", "2"}},
      {"tp4_sp", 4, {"--tensor-model-parallel-size", "4", "--sequence-parallel"}},
      {"tp2_dp2_sp_distopt", 4, {"--tensor-model-parallel-size", "2", "--sequence-parallel",
                                 "--use-distributed-optimizer"}},
      {"tp2_pp2_sp", 4, {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                         "--sequence-parallel"}},
  };
  return all;
}

// Hidden 64: d_inner 128, 8 heads of 16 in 4 groups (d_state 8), so TP 4 leaves one group of two
// heads per rank. LayerNorm (with the pre-norm's bias) and RMSNorm; dropout on.
const std::vector<std::string> kHybrid = {
    "--is-hybrid-model", "--hybrid-override-pattern", "M*-M", "--num-layers", "4", "--hidden-size", "64",
    "--num-attention-heads", "8", "--mamba-state-dim", "8", "--mamba-head-dim", "16", "--mamba-num-groups", "4",
    "--seq-length", "16", "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "8",
    "--train-iters", "5", "--lr", "2e-3", "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--mock-data",
    "--make-vocab-size-divisible-by", "64", "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--eval-iters",
    "0", "--log-interval", "1000", "--clip-grad", "0.5", "--position-embedding-type", "rope"};

class HybridInvariance : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(HybridInvariance, MatchesSingleProcess) {
  const auto& [name, rms] = GetParam();
  std::vector<std::string> model = kHybrid;
  if (rms) model.insert(model.end(), {"--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear"});
  testing::expect_layout_matches_single_process(layouts(), name, model, 3e-5, "mixer.in_proj.weight");
}

INSTANTIATE_TEST_SUITE_P(Layouts, HybridInvariance,
                         ::testing::Combine(::testing::ValuesIn(testing::layout_names(layouts())), ::testing::Bool()),
                         [](const auto& info) {
                           return std::get<0>(info.param) + (std::get<1>(info.param) ? "_rms" : "_ln");
                         });

}  // namespace
}  // namespace gale
