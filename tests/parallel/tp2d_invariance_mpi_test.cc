// --tp-2d under mpirun: 2-D tensor parallelism reproduces the single-process run, and checkpoints
// move between TP 2x2 and TP 1 bit for bit.
//
// Models: "gpt" (8 heads MHA, hidden 48, FFN 100, LayerNorm, GeLU, biases, learned positions) and
// "llama" (8 heads in 4 query groups, hidden 64, FFN 96, RoPE, SwiGLU, RMSNorm, a QKV bias, no
// other biases, untied output layer); both with hidden and attention dropout 0.1, so the dropout
// masks of the [T/X, H/Y] pieces must be the single-process ones. Layouts (X x Y grids): 2x1 and
// 1x2 on 2 ranks; on 4: 2x2, 1x2 with DP 2 and the distributed optimizer, 2x1 with PP 2 (1F1B, and
// interleaved with 2 virtual stages of a 4-layer model), 2x2 with full recomputation, and CP 2
// (2x1 ring, 1x2 all-gather, 1x2 Ulysses); on 8: 2x2 with DP 2 (distributed optimizer), PP 2 or
// ring CP 2. Losses and grad norms within 1e-5 relative, parameters and gradients as
// layout_invariance.h checks; --qk-layernorm at 2x2 and 1x2, ALiBi at 2x2.
#include <gtest/gtest.h>

#include <filesystem>
#include <tuple>
#include <unistd.h>

#include "checkpoint_checks.h"
#include "layout_invariance.h"
#include "train/checkpointing.h"

namespace gale {
namespace {

using testing::Layout;

std::vector<std::string> tp2d(const char* x, const char* y, const char* tp, std::vector<std::string> more = {}) {
  std::vector<std::string> f = {"--tensor-model-parallel-size", tp, "--tp-2d", "--tp-x", x, "--tp-y", y};
  f.insert(f.end(), more.begin(), more.end());
  return f;
}

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {"x2y1", 2, tp2d("2", "1", "2")},
      {"x1y2", 2, tp2d("1", "2", "2")},
      {"x2y2", 4, tp2d("2", "2", "4")},
      {"x1y2_dp2_distopt", 4, tp2d("1", "2", "2", {"--use-distributed-optimizer"})},
      {"x2y1_pp2", 4, tp2d("2", "1", "2", {"--pipeline-model-parallel-size", "2"})},
      {"x2y1_pp2_vpp2", 4,
       tp2d("2", "1", "2", {"--pipeline-model-parallel-size", "2", "--num-layers", "4",
                            "--num-layers-per-virtual-pipeline-stage", "1"})},
      {"x2y2_full_recompute", 4,
       tp2d("2", "2", "4", {"--recompute-granularity", "full", "--recompute-method", "uniform",
                            "--recompute-num-layers", "1"})},
      {"x2y1_cp2_ring", 4, tp2d("2", "1", "2", {"--context-parallel-size", "2"})},
      {"x1y2_cp2_allgather", 4, tp2d("1", "2", "2", {"--context-parallel-size", "2", "--cp-comm-type", "allgather"})},
      {"x1y2_cp2_ulysses", 4,
       tp2d("1", "2", "2", {"--context-parallel-size", "2", "--context-parallel-algo", "ulysses_cp_algo"})},
      {"x2y2_dp2_distopt", 8, tp2d("2", "2", "4", {"--use-distributed-optimizer"})},
      {"x2y2_cp2_ring", 8, tp2d("2", "2", "4", {"--context-parallel-size", "2"})},
      {"x2y2_pp2", 8, tp2d("2", "2", "4", {"--pipeline-model-parallel-size", "2"})},
  };
  return all;
}

const std::vector<std::string> kCommon = {
    "--num-layers", "2", "--seq-length", "12", "--max-position-embeddings", "12", "--micro-batch-size", "2",
    "--global-batch-size", "8", "--train-iters", "6", "--lr", "2e-3", "--lr-warmup-iters", "1", "--lr-decay-style",
    "cosine", "--mock-data", "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--eval-iters", "0",
    "--log-interval", "1000", "--clip-grad", "0.5", "--make-vocab-size-divisible-by", "64"};
const std::vector<std::string> kGpt = {"--num-attention-heads", "8", "--hidden-size", "48", "--ffn-hidden-size", "100"};
const std::vector<std::string> kLlama = {
    "--num-attention-heads", "8", "--hidden-size", "64", "--ffn-hidden-size", "96", "--group-query-attention",
    "--num-query-groups", "4", "--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope",
    "--disable-bias-linear", "--add-qkv-bias", "--untie-embeddings-and-output-weights"};

class Tp2dInvariance : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(Tp2dInvariance, MatchesSingleProcess) {
  const auto& [name, llama] = GetParam();
  testing::expect_layout_matches_single_process(layouts(), name, testing::join({kCommon, llama ? kLlama : kGpt}),
                                                3e-5, "linear_qkv.weight");
}

INSTANTIATE_TEST_SUITE_P(Layouts, Tp2dInvariance,
                         ::testing::Combine(::testing::ValuesIn(testing::layout_names(layouts())),
                                            ::testing::Bool()),
                         testing::layout_model_test_name);

// --qk-layernorm: each rank normalises the query and key heads it runs attention for (after the
// all-to-all over Y); the shared [HD] weights' gradients are partial sums, summed over TP.
TEST(Tp2dQkLayernorm, MatchesSingleProcessAt2x2) {
  testing::expect_layout_matches_single_process(layouts(), "x2y2", testing::join({kCommon, kLlama, {"--qk-layernorm"}}),
                                                3e-5, "q_layernorm.weight");
}

// LayerNorm q/k norms with biases; RoPE on every head dim, else k_layernorm.bias would shift every
// score of a query alike (a true gradient of 0 that AdamW turns into steps of rounding noise).
TEST(Tp2dQkLayernorm, LayerNormGptMatchesSingleProcessAt1x2) {
  testing::expect_layout_matches_single_process(
      layouts(), "x1y2", testing::join({kCommon, kGpt, {"--qk-layernorm", "--position-embedding-type", "rope"}}), 3e-5,
      "k_layernorm.bias");
}

// ALiBi: each rank's heads read their slopes at their global index (x·Y + y)·NH/(X·Y) + h.
TEST(Tp2dAlibi, MatchesSingleProcessAt2x2) {
  testing::expect_layout_matches_single_process(
      layouts(), "x2y2", testing::join({kCommon, kGpt, {"--position-embedding-type", "alibi"}}), 3e-5,
      "linear_qkv.weight");
}

// ---- checkpoints between TP 2x2 and TP 1 ----

std::vector<std::string> run_flags(const std::vector<std::string>& layout) {
  return testing::join({kCommon, kLlama, layout});
}

void expect_checkpoint_moves(const std::vector<std::string>& from, const std::vector<std::string>& to,
                             const std::string& name) {
  testing::expect_checkpoint_moves(run_flags, from, to, "tp2d_" + name);
}

TEST(Tp2dCheckpoint, SavedAt2x2ResumesAtTp1AndBack) {
  if (test::world()->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  expect_checkpoint_moves(tp2d("2", "2", "4"), {}, "x2y2_to_tp1");
  expect_checkpoint_moves({}, tp2d("2", "2", "4"), "tp1_to_x2y2");
}

// The distributed optimizer's state is saved as boxes of the owned ranges of the 2-D blocks.
TEST(Tp2dCheckpoint, DistributedOptimizerStateMovesBetween1x2Dp2AndTp1) {
  if (test::world()->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  expect_checkpoint_moves(tp2d("1", "2", "2", {"--use-distributed-optimizer"}), {}, "x1y2_distopt_to_tp1");
  expect_checkpoint_moves({"--use-distributed-optimizer"}, tp2d("1", "2", "2", {"--use-distributed-optimizer"}),
                          "tp1_distopt_to_x1y2");
}

}  // namespace
}  // namespace gale
