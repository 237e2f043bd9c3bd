// Parallel invariance of --qat-scheme: MX blocks run along each weight's input dimension of one
// rank's shard, so with the block size dividing the row-parallel shards (linear_proj, linear_fc2)
// every layout fake-quantises the same blocks of the same master values. Tensor parallelism (with
// SP and full recomputation, and --unaligned-linear's uneven shares; multi-latent attention), pipeline and data parallelism (distributed optimizer) and, for the
// MoE models, expert tensor and expert parallelism reproduce the single-process run: losses
// and grad norms within 1e-5 relative, final parameters 1e-3, final gradients 3e-5 (as the other
// invariance suites), over two steps (below: why not more). A layout that quantised other blocks
// (whole rows of a row-parallel weight, say) is off by a quantisation error, ~1e-2 relative.
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
      {"tp2_sp_bf16", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
      {"ep2", 2, {"--expert-model-parallel-size", "2"}},
      {"tp2_unaligned", 2, {"--tensor-model-parallel-size", "2", "--unaligned-linear"}},
  };
  return all;
}

// hidden 64, 8 heads of 8 (linear_proj's input 32 per rank under TP 2), ffn 256 (128 per rank).
const std::vector<std::string> kCommon = {
    "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "8", "--seq-length", "16",
    "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "5",
    "--lr", "2e-3", "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--mock-data",
    "--make-vocab-size-divisible-by", "64", "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--eval-iters",
    "0", "--log-interval", "1000", "--clip-grad", "0.5", "--qat-quant-block-size", "32"};
// Experts with ffn 64 (32 per rank under expert TP 2), dense layer 2, no biases.
const std::vector<std::string> kMoe = {"--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "64",
                                       "--moe-layer-freq", "[1,1,0,1]", "--moe-aux-loss-coeff", "0.1",
                                       "--disable-bias-linear"};

struct Model {
  const char* name;
  std::vector<std::string> flags;
};

const std::vector<Model>& models() {
  static const std::vector<Model> all = {
      {"mxfp4", {"--qat-scheme", "w4a16-mxfp4"}},
      {"mxfp8", {"--qat-scheme", "w8a16-mxfp8"}},
      {"mxfp4_moe", testing::join({{"--qat-scheme", "w4a16-mxfp4"}, kMoe})},
      {"mxfp8_moe_only", testing::join({{"--qat-scheme", "w8a16-mxfp8-moe-only"}, kMoe})},
      // 3 heads of 32: under --unaligned-linear TP 2 rank 0 holds 64 columns of linear_proj, rank 1 32.
      {"mxfp4_3heads", {"--qat-scheme", "w4a16-mxfp4", "--num-attention-heads", "3", "--kv-channels", "32"}},
      // DeepSeek-like multi-latent attention: latents of 32, linear_proj 8 heads x 8 (32 per rank).
      {"mxfp8_mla", {"--qat-scheme", "w8a16-mxfp8", "--multi-latent-attention", "--q-lora-rank", "32", "--kv-lora-rank",
                     "32", "--qk-head-dim", "8", "--qk-pos-emb-head-dim", "4", "--v-head-dim", "8", "--qk-layernorm",
                     "--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope",
                     "--disable-bias-linear", "--untie-embeddings-and-output-weights"}},
  };
  return all;
}

class QatInvariance : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(QatInvariance, MatchesSingleProcess) {
  const auto& [name, m] = GetParam();
  const Model& model = models()[static_cast<size_t>(m)];
  std::vector<std::string> flags = testing::join({kCommon, model.flags});
  const bool moe = m == 2 || m == 3;
  if (name == "tp2" && moe) GTEST_SKIP() << "MoE under TP needs --sequence-parallel (tp2_sp)";
  if (name == "ep2" && !moe) GTEST_SKIP() << "expert parallelism: the MoE models only";
  if ((name == "tp2_unaligned") != (m == 4)) GTEST_SKIP() << "the 3-head model runs only the unaligned layout";
  if (name == "tp2_sp_bf16") {
    if (m != 0) GTEST_SKIP() << "bf16: the dense MXFP4 model only";
    flags.push_back("--bf16");
  }
  // Two steps: the first on identical masters (identical blocks, identical fake-quantised weights),
  // the second on masters a last bit apart. Longer runs are not held to these tolerances: a master
  // that moves across a rounding boundary in one layout and not the other (seen at step 4 of the
  // MXFP8 model under TP 2) changes that weight by a whole quantisation step.
  // The bf16 layout is held to its own bf16 single-process run (the flag is part of the model).
  const Layout* layout = testing::find_layout(layouts(), name);
  ASSERT_NE(layout, nullptr) << name;
  if (layout->world != test::world()->size()) GTEST_SKIP() << name << " needs " << layout->world << " ranks";
  testing::LayoutAndReference t = testing::train_layout_and_reference(flags, *layout, 2);
  EXPECT_GT(testing::expect_matches_reference(*t.run, *t.reference, 2, name == "tp2_sp_bf16" ? 1e-3 : 3e-5,
                                              "linear_fc2.weight"),
            0);
}

INSTANTIATE_TEST_SUITE_P(Layouts, QatInvariance,
                         ::testing::Combine(::testing::ValuesIn(testing::layout_names(layouts())),
                                            ::testing::Range(0, 6)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + models()[std::get<1>(info.param)].name;
                         });

}  // namespace
}  // namespace gale
