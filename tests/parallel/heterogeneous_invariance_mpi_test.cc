// Parallel invariance of heterogeneous layers (--heterogeneous-layers-config-encoded-json): tensor
// parallelism (with and without sequence parallelism: the linear replacements' gathered output) and
// pipeline parallelism (stages holding different layer kinds, with full recomputation) and data
// parallelism with the distributed optimizer, and context parallelism (ring, all-gather-free Ulysses
// all-to-all with whole or repeated groups per layer, hybrid Ulysses x ring) reproduce the single-process run:
// losses and grad norms within 1e-5 relative, final parameters and gradients as
// tests/parallel/qk_layernorm_invariance_mpi_test.cc.
#include <gtest/gtest.h>

#include <algorithm>

#include "checkpoint_checks.h"
#include "layout_invariance.h"

namespace gale {
namespace {

using testing::Layout;

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {"tp2", 2, {"--tensor-model-parallel-size", "2"}},
      {"tp2_sp", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
      {"pp2", 2, {"--pipeline-model-parallel-size", "2"}},
      {"pp2_full_recompute", 2, {"--pipeline-model-parallel-size", "2", "--recompute-granularity", "full",
                                 "--recompute-method", "uniform", "--recompute-num-layers", "1"}},
      {"dp2_distopt", 2, {"--use-distributed-optimizer"}},
      {"cp2", 2, {"--context-parallel-size", "2"}},
      {"cp2_a2a", 2, {"--context-parallel-size", "2", "--cp-comm-type", "a2a"}},
      {"cp4_a2a", 4, {"--context-parallel-size", "4", "--cp-comm-type", "a2a"}},  // layer 0: 2 groups repeated
      {"cp4_a2a_p2p", 4, {"--context-parallel-size", "4", "--cp-comm-type", "a2a+p2p",
                          "--hierarchical-context-parallel-sizes", "2", "2"}},
      {"tp2_cp2_sp", 4, {"--tensor-model-parallel-size", "2", "--context-parallel-size", "2", "--sequence-parallel"}},
      {"tp2_pp2_sp", 4, {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                         "--sequence-parallel"}},
  };
  return all;
}

// Four layers of every kind: 2 query groups and ffn_mult 1.0 (FFN 256); no-op attention and a
// linear MLP; a linear attention and FFN 96; the default 4 groups and a no-op MLP.
const char* kBlocks = R"({"num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 8, "block_configs": [
  {"attention": {"n_heads_in_group": 4, "no_op": false, "replace_with_linear": false},
   "ffn": {"ffn_mult": 1.0, "no_op": false, "replace_with_linear": false}},
  {"attention": {"n_heads_in_group": null, "no_op": true, "replace_with_linear": false},
   "ffn": {"ffn_mult": null, "no_op": false, "replace_with_linear": true}},
  {"attention": {"n_heads_in_group": null, "no_op": false, "replace_with_linear": true},
   "ffn": {"ffn_hidden_size": 96, "no_op": false, "replace_with_linear": false}},
  {"attention": {"n_heads_in_group": 2, "no_op": false, "replace_with_linear": false},
   "ffn": {"ffn_mult": null, "no_op": true, "replace_with_linear": false}}]})";

// LLaMA-like (RMSNorm, SwiGLU, RoPE, untied) with biases on, so that the linear replacements' TP-split
// biases count, and dropout everywhere.
const std::vector<std::string> kCommon = {
    "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "8", "--seq-length", "16",
    "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "5",
    "--lr", "2e-3", "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--mock-data",
    "--make-vocab-size-divisible-by", "64", "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--eval-iters",
    "0", "--log-interval", "1000", "--clip-grad", "0.5", "--position-embedding-type", "rope",
    "--group-query-attention", "--num-query-groups", "4", "--normalization", "RMSNorm", "--swiglu",
    "--untie-embeddings-and-output-weights", "--heterogeneous-layers-config-encoded-json", kBlocks};

class HeterogeneousInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(HeterogeneousInvariance, MatchesSingleProcess) {
  testing::expect_layout_matches_single_process(layouts(), GetParam(), kCommon, 3e-5, "linear_qkv.weight");
}

// With --mtp-num-layers 1 (the MTP layer the flags' usual layer, after the heterogeneous decoder;
// Megatron refuses MTP with context parallelism, so no CP layouts).
const std::vector<Layout>& mtp_layouts() {
  static const std::vector<Layout> all = {
      {"tp2_mtp", 2, {"--tensor-model-parallel-size", "2"}},
      {"pp2_mtp", 2, {"--pipeline-model-parallel-size", "2"}},
      {"dp2_distopt_mtp", 2, {"--use-distributed-optimizer"}},
      {"tp2_pp2_sp_mtp", 4, {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                             "--sequence-parallel"}},
  };
  return all;
}

class HeterogeneousMtpInvariance : public ::testing::TestWithParam<std::string> {};

// The MTP loss of every iteration too; the MTP layer's stage holds its parameters.
TEST_P(HeterogeneousMtpInvariance, MatchesSingleProcess) {
  const Layout* layout = testing::find_layout(mtp_layouts(), GetParam());
  ASSERT_NE(layout, nullptr);
  if (layout->world != test::world()->size()) GTEST_SKIP() << GetParam() << " needs " << layout->world << " ranks";
  testing::LayoutAndReference t = testing::train_layout_and_reference(
      testing::join({kCommon, {"--mtp-num-layers", "1", "--mtp-loss-scaling-factor", "0.3"}}), *layout, 5);
  for (int i = 0; i < 5; ++i) {
    ASSERT_EQ(t.run->mtp_losses[i].size(), 1u);
    ASSERT_EQ(t.reference->mtp_losses[i].size(), 1u);
    EXPECT_NEAR(t.run->mtp_losses[i][0], t.reference->mtp_losses[i][0], 1e-5 * t.reference->mtp_losses[i][0])
        << "mtp_1 loss of iteration " << i + 1;
  }
  const int named = testing::expect_matches_reference(*t.run, *t.reference, 5, 3e-5,
                                                      "mtp.layers.0.transformer_layer.self_attention.linear_qkv");
  if (t.run->engine->chunks.back()->partition().post_process) EXPECT_GT(named, 0);
}

INSTANTIATE_TEST_SUITE_P(Layouts, HeterogeneousMtpInvariance, ::testing::ValuesIn(testing::layout_names(mtp_layouts())),
                         [](const auto& info) { return info.param; });

// MoE (--num-experts 4, top-2, a dense first layer): as Megatron's MoE block spec, per-layer query
// groups and FFN sizes only (a dense layer's FFN; the MoE layers keep --moe-ffn-hidden-size).
const char* kMoeBlocks = R"({"num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 8, "block_configs": [
  {"attention": {"n_heads_in_group": 4, "no_op": false, "replace_with_linear": false},
   "ffn": {"ffn_hidden_size": 96, "no_op": false, "replace_with_linear": false}},
  {"attention": {"n_heads_in_group": null}, "ffn": {"ffn_mult": null}},
  {"attention": {"n_heads_in_group": 2}, "ffn": {}},
  {"attention": {"num_query_groups": 8}, "ffn": {}}]})";

std::vector<std::string> moe_model() {
  std::vector<std::string> flags = kCommon;
  *(std::find(flags.begin(), flags.end(), std::string(kBlocks))) = kMoeBlocks;
  flags.insert(flags.end(), {"--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "48",
                             "--moe-layer-freq", "[0,1,1,1]", "--moe-aux-loss-coeff", "0.01"});
  return flags;
}

const std::vector<Layout>& moe_layouts() {
  static const std::vector<Layout> all = {
      {"ep2_moe", 2, {"--expert-model-parallel-size", "2"}},
      {"tp2_sp_moe", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
      {"pp2_moe", 2, {"--pipeline-model-parallel-size", "2"}},
      {"tp2_ep2_sp_moe", 4, {"--tensor-model-parallel-size", "2", "--expert-model-parallel-size", "2",
                             "--sequence-parallel"}},
  };
  return all;
}

class HeterogeneousMoeInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(HeterogeneousMoeInvariance, MatchesSingleProcess) {
  testing::expect_layout_matches_single_process(moe_layouts(), GetParam(), moe_model(), 3e-5, "layers");
}

INSTANTIATE_TEST_SUITE_P(Layouts, HeterogeneousMoeInvariance, ::testing::ValuesIn(testing::layout_names(moe_layouts())),
                         [](const auto& info) { return info.param; });

// MindSpeed's --unaligned-linear: 6 heads of 8 in 3 query groups by default, so TP 2 deals out
// groups 2 + 1 and FFN columns unevenly. Layers: 0 two groups, FFN 75; 1 no-op attention, linear
// MLP; 2 linear attention, FFN 50; 3 the flags' 3 groups and FFN 100.
const char* kUnalignedBlocks = R"({"block_configs": [
  {"attention": {"n_heads_in_group": 3}, "ffn": {"ffn_hidden_size": 75}},
  {"attention": {"no_op": true}, "ffn": {"replace_with_linear": true}},
  {"attention": {"replace_with_linear": true}, "ffn": {"ffn_hidden_size": 50}},
  {"attention": {}, "ffn": {}}]})";

std::vector<std::string> unaligned_model() {
  std::vector<std::string> flags = kCommon;
  const auto set = [&](const std::string& flag, const std::string& value) {
    *(std::find(flags.begin(), flags.end(), flag) + 1) = value;
  };
  set("--hidden-size", "48");
  set("--num-attention-heads", "6");
  set("--num-query-groups", "3");
  set("--heterogeneous-layers-config-encoded-json", kUnalignedBlocks);
  flags.insert(flags.end(), {"--ffn-hidden-size", "100", "--unaligned-linear"});
  return flags;
}

const std::vector<Layout>& unaligned_layouts() {
  static const std::vector<Layout> all = {
      {"tp2_unaligned", 2, {"--tensor-model-parallel-size", "2"}},
      {"tp2_sp_unaligned", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
      {"tp2_pp2_unaligned", 4, {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"}},
  };
  return all;
}

class HeterogeneousUnalignedInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(HeterogeneousUnalignedInvariance, MatchesSingleProcess) {
  testing::expect_layout_matches_single_process(unaligned_layouts(), GetParam(), unaligned_model(), 3e-5, "layers");
}

INSTANTIATE_TEST_SUITE_P(Layouts, HeterogeneousUnalignedInvariance,
                         ::testing::ValuesIn(testing::layout_names(unaligned_layouts())),
                         [](const auto& info) { return info.param; });

// Checkpoints of the uneven split: saved at TP 2 and resumed at TP 1, and back (the layers' own
// uneven shards gathered and dealt out again).
TEST(HeterogeneousUnalignedCheckpoint, MovesBetweenTp2AndTp1) {
  if (test::world()->size() != 2) GTEST_SKIP() << "needs 2 ranks";
  const auto run_flags = [](const std::vector<std::string>& layout) {
    return testing::join({unaligned_model(), layout});
  };
  testing::expect_checkpoint_moves(run_flags, {"--tensor-model-parallel-size", "2"}, {}, "hetero_unaligned_tp2_to_tp1");
  testing::expect_checkpoint_moves(run_flags, {}, {"--tensor-model-parallel-size", "2"}, "hetero_unaligned_tp1_to_tp2");
}

INSTANTIATE_TEST_SUITE_P(Layouts, HeterogeneousInvariance, ::testing::ValuesIn(testing::layout_names(layouts())),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace gale
