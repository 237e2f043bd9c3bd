// Parallel invariance of a hybrid Mamba model's multi-token prediction (--hybrid-layer-pattern
// "M*-M/*M-/*M-": 2 depths of attention, Mamba and MLP layers after the decoder): tensor parallelism
// (the depths' Mamba mixers split by head and group, eh_proj column-parallel with its output
// gathered), with sequence parallelism (the MTP norms' and the Mamba layers' gated norms' gradients
// summed over TP), with data parallelism and the distributed optimizer, pipeline parallelism (the MTP
// block on the last stage with its copy of the embedding), with TP and SP, and full recomputation of
// the decoder reproduce the single-process run: losses, MTP losses and grad norms within 1e-5
// relative, final parameters 1e-3 and final gradients 3e-5 (as tests/parallel/hybrid_invariance_mpi_test.cc;
// a wrong split or a missing reduction is off by O(1)). Context parallelism is refused with MTP
// (tests/train/arguments_hybrid_test.cc).
#include <gtest/gtest.h>

#include <algorithm>

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

// Hidden 64: d_inner 128, 8 heads of 16 in 4 groups (d_state 8); RoPE, dropout on.
const std::vector<std::string> kHybridMtp = {
    "--is-hybrid-model", "--hybrid-layer-pattern", "M*-M/*M-/*M-", "--hidden-size", "64",
    "--num-attention-heads", "8", "--mamba-state-dim", "8", "--mamba-head-dim", "16", "--mamba-num-groups", "4",
    "--seq-length", "16", "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "8",
    "--train-iters", "4", "--lr", "2e-3", "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--mock-data",
    "--make-vocab-size-divisible-by", "64", "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--eval-iters",
    "0", "--log-interval", "1000", "--clip-grad", "0.5", "--position-embedding-type", "rope",
    "--mtp-loss-scaling-factor", "0.3"};

class HybridMtpInvariance : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(HybridMtpInvariance, MatchesSingleProcess) {
  const auto& [name, rms] = GetParam();
  const Layout* layout = testing::find_layout(layouts(), name);
  ASSERT_NE(layout, nullptr);
  if (layout->world != test::world()->size()) GTEST_SKIP() << name << " needs " << layout->world << " ranks";
  std::vector<std::string> model = kHybridMtp;
  if (rms) model.insert(model.end(), {"--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear"});
  testing::LayoutAndReference t = testing::train_layout_and_reference(model, *layout, 4);
  const testing::TestRun &run = *t.run, &reference = *t.reference;
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(run.mtp_losses[i].size(), 2u);
    ASSERT_EQ(reference.mtp_losses[i].size(), 2u);
    for (int k = 0; k < 2; ++k)
      EXPECT_NEAR(run.mtp_losses[i][k], reference.mtp_losses[i][k], 1e-5 * reference.mtp_losses[i][k])
          << "mtp_" << k + 1 << " loss of iteration " << i + 1;
  }
  const int named =
      testing::expect_matches_reference(run, reference, 4, 3e-5, "mtp.layers.1.mtp_model_layer.layers.1.mixer.in_proj");
  if (run.engine->chunks.back()->partition().post_process) EXPECT_GT(named, 0);  // the MTP block's stage
}

// MTP depths of a Gated DeltaNet and a MoE layer ("M*-M/GE/GE"; Megatron main's MTP block takes every
// hybrid symbol): the depths' GDN mixers split by head over TP, their experts over EP, the block on
// the last pipeline stage. 2 key heads of 8, 4 value heads of 6; 4 experts, top-2.
const std::vector<Layout>& gdn_moe_layouts() {
  static const std::vector<Layout> all = {
      {"tp2_sp_gdn_moe", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
      {"pp2_gdn_moe", 2, {"--pipeline-model-parallel-size", "2"}},
      {"ep2_gdn_moe", 2, {"--expert-model-parallel-size", "2"}},
  };
  return all;
}

class HybridMtpGdnMoeInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(HybridMtpGdnMoeInvariance, MatchesSingleProcess) {
  const Layout* layout = testing::find_layout(gdn_moe_layouts(), GetParam());
  ASSERT_NE(layout, nullptr);
  if (layout->world != test::world()->size()) GTEST_SKIP() << GetParam() << " needs " << layout->world << " ranks";
  std::vector<std::string> model = kHybridMtp;
  *std::find(model.begin(), model.end(), std::string("M*-M/*M-/*M-")) = "M*-M/GE/GE";
  model.insert(model.end(), {"--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear",
                             "--linear-num-key-heads", "2", "--linear-num-value-heads", "4", "--linear-key-head-dim",
                             "8", "--linear-value-head-dim", "6", "--linear-conv-kernel-dim", "3", "--num-experts", "4",
                             "--moe-router-topk", "2", "--moe-ffn-hidden-size", "32"});
  testing::LayoutAndReference t = testing::train_layout_and_reference(model, *layout, 4);
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(t.run->mtp_losses[i].size(), 2u);
    for (int k = 0; k < 2; ++k)
      EXPECT_NEAR(t.run->mtp_losses[i][k], t.reference->mtp_losses[i][k], 1e-5 * t.reference->mtp_losses[i][k])
          << "mtp_" << k + 1 << " loss of iteration " << i + 1;
  }
  const int named = testing::expect_matches_reference(*t.run, *t.reference, 4, 3e-5,
                                                      "mtp.layers.1.mtp_model_layer.layers.0.self_attention.in_proj");
  if (t.run->engine->chunks.back()->partition().post_process) EXPECT_GT(named, 0);
}

INSTANTIATE_TEST_SUITE_P(Layouts, HybridMtpGdnMoeInvariance,
                         ::testing::ValuesIn(testing::layout_names(gdn_moe_layouts())),
                         [](const auto& info) { return info.param; });

INSTANTIATE_TEST_SUITE_P(Layouts, HybridMtpInvariance,
                         ::testing::Combine(::testing::ValuesIn(testing::layout_names(layouts())), ::testing::Bool()),
                         [](const auto& info) {
                           return std::get<0>(info.param) + (std::get<1>(info.param) ? "_rms" : "_ln");
                         });

}  // namespace
}  // namespace gale
