// --unaligned-linear under mpirun: TP sizes that do not divide the heads, query groups or FFN
// reproduce the single-process run, and checkpoints move between TP 3 and TP 1 bit for bit.
//
// Models: "gpt" (6 heads MHA, FFN 100, LayerNorm, GeLU, biases: TP 4 holds 2, 2, 1, 1 heads, TP 3
// 34, 33, 33 FFN columns), "gpt_alibi" (the same with ALiBi: each rank's heads read their slopes at
// their global index) and "llama_gqa" (10 heads in 5 query groups, FFN 100, RoPE, SwiGLU, RMSNorm,
// a QKV bias: TP 3 holds 2, 2, 1 groups of 2 heads, TP 2 3 and 2). Layouts: TP 2, 3 and 4, with
// sequence parallelism, the flash kernel, the distributed optimizer over DP 2, PP 2 and ring CP 2. Losses and
// grad norms within 1e-5 relative, parameters and gradients as layout_invariance.h checks. The
// vocabulary pads to the same size at TP 1 and the tested TP (252 for TP 3, 256 for TP 2 and 4).
// Muon's duplicated mode at TP 3 gathers the uneven shards; --qk-layernorm at TP 3 norms uneven head sets.
#include <gtest/gtest.h>

#include <filesystem>
#include <tuple>
#include <unistd.h>

#include "checkpoint_checks.h"
#include "ckpt/checkpoint_reader.h"
#include "layout_invariance.h"
#include "train/checkpointing.h"

namespace gale {
namespace {

using testing::Layout;

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {"tp2", 2, {"--unaligned-linear", "--tensor-model-parallel-size", "2"}},
      {"tp3", 3, {"--unaligned-linear", "--tensor-model-parallel-size", "3"}},
      {"tp3_sp_flash", 3, {"--unaligned-linear", "--tensor-model-parallel-size", "3", "--sequence-parallel"}, 0, {},
       true},
      {"tp4", 4, {"--unaligned-linear", "--tensor-model-parallel-size", "4"}},
      {"tp4_sp", 4, {"--unaligned-linear", "--tensor-model-parallel-size", "4", "--sequence-parallel"}},
      {"tp3_dp2_distopt", 6,
       {"--unaligned-linear", "--tensor-model-parallel-size", "3", "--use-distributed-optimizer"}},
      {"tp3_pp2", 6, {"--unaligned-linear", "--tensor-model-parallel-size", "3", "--pipeline-model-parallel-size", "2"}},
      {"tp3_cp2", 6, {"--unaligned-linear", "--tensor-model-parallel-size", "3", "--context-parallel-size", "2"}},
  };
  return all;
}

const std::vector<std::string> kCommon = {
    "--num-layers", "2", "--seq-length", "12", "--max-position-embeddings", "12", "--micro-batch-size", "2",
    "--global-batch-size", "12", "--train-iters", "6", "--lr", "2e-3", "--lr-warmup-iters", "1", "--lr-decay-style",
    "cosine", "--mock-data", "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--eval-iters", "0",
    "--log-interval", "1000", "--clip-grad", "0.5", "--ffn-hidden-size", "100"};
const std::vector<std::string> kGpt = {"--num-attention-heads", "6", "--hidden-size", "48"};
const std::vector<std::string> kGptAlibi = {"--num-attention-heads", "6", "--hidden-size", "48",
                                            "--position-embedding-type", "alibi"};
const std::vector<std::string> kLlamaGqa = {
    "--num-attention-heads", "10", "--hidden-size", "80", "--group-query-attention", "--num-query-groups", "5",
    "--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope", "--disable-bias-linear",
    "--add-qkv-bias", "--untie-embeddings-and-output-weights"};

const std::vector<std::string>& model_flags(const std::string& model) {
  return model == "gpt" ? kGpt : model == "gpt_alibi" ? kGptAlibi : kLlamaGqa;
}

// --make-vocab-size-divisible-by d such that TP `tp` pads the 250 tokens as TP 1 does.
std::vector<std::string> vocab_flags(int tp) {
  return {"--make-vocab-size-divisible-by", tp % 3 == 0 ? "4" : "64"};
}

int tp_of(const Layout& layout) {
  const auto it = std::find(layout.flags.begin(), layout.flags.end(), "--tensor-model-parallel-size");
  return it == layout.flags.end() ? 1 : std::stoi(*(it + 1));
}

class UnalignedLinearInvariance : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(UnalignedLinearInvariance, MatchesSingleProcess) {
  const auto& [name, model] = GetParam();
  const Layout* layout = testing::find_layout(layouts(), name);
  ASSERT_NE(layout, nullptr);
  testing::expect_layout_matches_single_process(
      layouts(), name, testing::join({kCommon, model_flags(model), vocab_flags(tp_of(*layout))}), 3e-5,
      "linear_qkv.weight");
}

INSTANTIATE_TEST_SUITE_P(Layouts, UnalignedLinearInvariance,
                         ::testing::Combine(::testing::ValuesIn(testing::layout_names(layouts())),
                                            ::testing::Values("gpt", "gpt_alibi", "llama_gqa")),
                         [](const auto& info) { return std::get<0>(info.param) + "_" + std::get<1>(info.param); });

// --optimizer muon (--muon-tp-mode duplicated, the default): the uneven shards of every matrix are
// gathered (padded to the largest) and orthogonalised whole, as in the single-process run.
TEST(UnalignedLinearMuon, DuplicatedModeMatchesSingleProcessAtTp3) {
  testing::expect_layout_matches_single_process(
      layouts(), "tp3",
      testing::join({kCommon, kLlamaGqa, vocab_flags(3), {"--optimizer", "muon", "--muon-fp32-matmul-prec", "high"}}),
      3e-5, "linear_qkv.weight");
}

// --qk-layernorm: each rank normalises its own 4, 4 or 2 query heads and 2, 2 or 1 key heads; the
// shared weights' gradients are partial sums over the uneven head sets, all-reduced over TP.
TEST(UnalignedLinearQkLayernorm, MatchesSingleProcessAtTp3) {
  testing::expect_layout_matches_single_process(
      layouts(), "tp3", testing::join({kCommon, kLlamaGqa, vocab_flags(3), {"--qk-layernorm"}}), 3e-5,
      "q_layernorm.weight");
}

// ---- checkpoints between TP 3 and TP 1 ----

std::vector<std::string> run_flags(const std::vector<std::string>& layout) {
  return testing::join({kCommon, kLlamaGqa, vocab_flags(3), layout});
}

void expect_checkpoint_moves(const std::vector<std::string>& from, const std::vector<std::string>& to,
                             const std::string& name) {
  testing::expect_checkpoint_moves(run_flags, from, to, "unaligned_" + name);
}

TEST(UnalignedLinearCheckpoint, SavedAtTp3ResumesAtTp1) {
  if (test::world()->size() != 3) GTEST_SKIP() << "needs 3 ranks";
  expect_checkpoint_moves({"--unaligned-linear", "--tensor-model-parallel-size", "3"}, {}, "tp3_to_tp1");
}

TEST(UnalignedLinearCheckpoint, SavedAtTp1ResumesAtTp3) {
  if (test::world()->size() != 3) GTEST_SKIP() << "needs 3 ranks";
  expect_checkpoint_moves({}, {"--unaligned-linear", "--tensor-model-parallel-size", "3"}, "tp1_to_tp3");
}

// The distributed optimizer saves its state as boxes of the owned ranges (optim/shard_boxes.h),
// shifted by each rank's uneven offset; resumed without it at TP 1 · DP 3 and with it at TP 3.
TEST(UnalignedLinearCheckpoint, DistributedOptimizerStateMovesBetweenTp3AndTp1) {
  if (test::world()->size() != 3) GTEST_SKIP() << "needs 3 ranks";
  expect_checkpoint_moves({"--unaligned-linear", "--tensor-model-parallel-size", "3", "--use-distributed-optimizer"},
                          {}, "tp3_distopt_to_tp1");
  expect_checkpoint_moves({"--use-distributed-optimizer"},
                          {"--unaligned-linear", "--tensor-model-parallel-size", "3", "--use-distributed-optimizer"},
                          "tp1_distopt_to_tp3");
}

}  // namespace
}  // namespace gale
