// Parallel invariance of --optimizer muon: with --muon-tp-mode duplicated (the default) a matrix
// split over tensor-parallel ranks is gathered and orthogonalised whole on every rank, so tensor
// parallelism (column- and row-parallel weights, the fused QKV weight split per query group, the
// stacked SwiGLU fc1), with sequence parallelism, pipeline and data parallelism reproduce the
// single-process run: losses and grad norms within 1e-5 relative, final parameters 1e-3, final
// gradients 3e-5. The Newton-Schulz iteration runs in f32 (--muon-fp32-matmul-prec high): on bf16
// values ("medium") a last-bit difference of a TP-summed gradient may round a product to the
// neighbouring bf16 value. --muon-tp-mode blockwise orthogonalises each shard on its own, so its
// TP run differs from the single-process one (checked too: the modes are really different).
#include <gtest/gtest.h>

#include <cmath>

#include "layout_invariance.h"

namespace gale {
namespace {

using testing::Layout;

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {"tp2", 2, {"--tensor-model-parallel-size", "2"}},
      {"tp2_sp", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
      {"pp2", 2, {"--pipeline-model-parallel-size", "2"}},
      {"dp2", 2, {}},
      {"tp2_dp2_sp", 4, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
      {"tp2_pp2", 4, {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"}},
  };
  return all;
}

const std::vector<std::string> kCommon = {
    "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "8", "--seq-length", "16",
    "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "5",
    "--lr", "2e-3", "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--mock-data",
    "--make-vocab-size-divisible-by", "64", "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--eval-iters",
    "0", "--log-interval", "1000", "--clip-grad", "0.5", "--optimizer", "muon", "--muon-fp32-matmul-prec", "high"};
// LLaMA-like (GQA 8/2: the QKV split per query group; SwiGLU: fc1 holds gate and up blocks, each
// split over TP; untied output layer, RoPE) with Nesterov momentum, and GPT-like (MHA, biases,
// learned position embeddings: a replicated 2-D parameter that Muon updates too, tied embeddings).
const std::vector<std::string> kLlama = {"--group-query-attention", "--num-query-groups", "2", "--normalization",
                                         "RMSNorm", "--swiglu", "--disable-bias-linear",
                                         "--untie-embeddings-and-output-weights", "--position-embedding-type", "rope",
                                         "--muon-nesterov"};
const std::vector<std::string> kGptLike = {"--position-embedding-type", "learned_absolute"};

class MuonInvariance : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(MuonInvariance, MatchesSingleProcess) {
  const auto& [name, llama] = GetParam();
  testing::expect_layout_matches_single_process(layouts(), name, testing::join({kCommon, llama ? kLlama : kGptLike}),
                                                3e-5, "linear_qkv.weight");
}

INSTANTIATE_TEST_SUITE_P(Layouts, MuonInvariance,
                         ::testing::Combine(::testing::ValuesIn(testing::layout_names(layouts())), ::testing::Bool()),
                         [](const auto& info) {
                           return std::get<0>(info.param) + (std::get<1>(info.param) ? "_llama" : "_gpt");
                         });

// Blockwise: each TP rank orthogonalises its own shard, so the TP2 run moves away from the
// single-process one (same first loss, different later ones).
TEST(MuonBlockwise, DependsOnTheTensorParallelSize) {
  if (test::world()->size() != 2) GTEST_SKIP() << "needs 2 ranks";
  const std::vector<std::string> model = testing::join({kCommon, kLlama, {"--muon-tp-mode", "blockwise"}});
  const Layout tp2{"tp2_blockwise", 2, {"--tensor-model-parallel-size", "2"}};
  testing::LayoutAndReference t = testing::train_layout_and_reference(model, tp2, 3);
  EXPECT_NEAR(t.run->losses[0], t.reference->losses[0], 1e-5 * t.reference->losses[0]);
  EXPECT_GT(std::abs(t.run->losses[2] - t.reference->losses[2]), 1e-4 * t.reference->losses[2]);
}

}  // namespace
}  // namespace gale
