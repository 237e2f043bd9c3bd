// The hybrid Mamba model's parallel layouts at the argument level: tensor, sequence and context
// parallelism accepted when the TP size divides the mixer's groups and CP the heads of a TP rank
// (and divides or is a multiple of its groups; Megatron's MambaMixer and MambaContextParallel
// asserts), refused in one line naming the flags otherwise; what the Mamba layers still lack stays refused.
// MoE layers ('E'): accepted with --num-experts, with expert, tensor and context parallelism, their flag
// errors in one line.
#include <gtest/gtest.h>

#include "pretrain_cli.h"

namespace gale {
namespace {

using testing::FlagErrorCase;

// minimal_pretrain_flags' hidden 64: d_inner 128, 8 heads of 16, in `groups` groups.
std::vector<std::string> hybrid(const std::string& groups, std::vector<std::string> extra) {
  std::vector<std::string> flags = {"--is-hybrid-model", "--hybrid-override-pattern", "M*", "--mamba-head-dim", "16",
                                    "--mamba-num-groups", groups};
  flags.insert(flags.end(), extra.begin(), extra.end());
  return flags;
}

TEST(HybridArguments, TensorAndSequenceParallelAccepted) {
  for (const auto& [groups, world, flags] :
       std::vector<std::tuple<std::string, int64_t, std::vector<std::string>>>{
           {"2", 2, {"--tensor-model-parallel-size", "2"}},
           {"2", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
           {"4", 8,
            {"--tensor-model-parallel-size", "4", "--sequence-parallel", "--pipeline-model-parallel-size", "2"}},
           {"8", 8, {"--tensor-model-parallel-size", "8", "--num-attention-heads", "8"}}}) {
    testing::PretrainCli cli;
    const Status s = cli.parse_minimal(hybrid(groups, flags), world);
    EXPECT_TRUE(s.ok()) << groups << " groups at world " << world << ": " << s.to_string();
  }
}

// 'E' layers with --num-experts: one process, EP 2 over the DP ranks, TP 2 with SP (MoE under TP needs it),
// CP 2 alone and with EP 2 over the cp ranks.
std::vector<std::string> hybrid_pattern(const std::string& pattern, std::vector<std::string> extra) {
  std::vector<std::string> flags = {"--is-hybrid-model", "--hybrid-override-pattern", pattern, "--mamba-head-dim", "16",
                                    "--mamba-num-groups", "2"};
  flags.insert(flags.end(), extra.begin(), extra.end());
  return flags;
}
// A Gated DeltaNet layer ('G') beside a Mamba layer: SwiGLU, RMSNorm, 2 key heads of 8, 4 value heads of 8.
std::vector<std::string> hybrid_gdn(std::vector<std::string> extra) {
  extra.insert(extra.begin(), {"--swiglu", "--normalization", "RMSNorm", "--linear-num-key-heads", "2",
                               "--linear-num-value-heads", "4", "--linear-key-head-dim", "8", "--linear-value-head-dim",
                               "8"});
  return hybrid_pattern("MG", extra);
}
std::vector<std::string> hybrid_moe(std::vector<std::string> extra) {
  extra.insert(extra.begin(), {"--num-experts", "4", "--moe-router-topk", "2"});
  return hybrid_pattern("ME", extra);
}

TEST(HybridArguments, MoeLayersAcceptedWithExpertTensorAndContextParallelism) {
  for (const auto& [world, flags] : std::vector<std::pair<int64_t, std::vector<std::string>>>{
           {1, {}},
           {2, {"--expert-model-parallel-size", "2"}},
           {2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
           {4, {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--expert-model-parallel-size", "2"}},
           {2, {"--context-parallel-size", "2"}},
           {2, {"--context-parallel-size", "2", "--expert-model-parallel-size", "2"}}}) {
    testing::PretrainCli cli;
    const Status s = cli.parse_minimal(hybrid_moe(flags), world);
    ASSERT_TRUE(s.ok()) << "world " << world << ": " << s.to_string();
    EXPECT_EQ(cli.args.moe.layer_pattern, (std::vector<int>{0, 1})) << "the 'E' layer is the MoE layer";
  }
}

TEST(HybridArguments, ContextParallelAccepted) {
  // 8 heads: CP 2 with 2 groups (one per rank) and 1 group (its heads shared by both ranks), TP 2 x CP 2
  // (one group per TP rank, shared by its two cp ranks), CP 8 (one head per rank), and the CP algorithms
  // with Megatron's load-balanced split.
  for (const auto& [groups, world, flags] :
       std::vector<std::tuple<std::string, int64_t, std::vector<std::string>>>{
           {"2", 2, {"--context-parallel-size", "2"}},
           {"1", 2, {"--context-parallel-size", "2", "--cp-comm-type", "allgather"}},
           {"2", 4, {"--tensor-model-parallel-size", "2", "--context-parallel-size", "2", "--sequence-parallel"}},
           {"4", 8, {"--context-parallel-size", "8"}},
           {"4", 2, {"--context-parallel-size", "2", "--context-parallel-algo", "ulysses_cp_algo"}},
           {"4", 4,
            {"--context-parallel-size", "4", "--context-parallel-algo", "hybrid_cp_algo", "--ulysses-degree-in-cp",
             "2"}}}) {
    testing::PretrainCli cli;
    const Status s = cli.parse_minimal(hybrid(groups, flags), world);
    EXPECT_TRUE(s.ok()) << groups << " groups at world " << world << ": " << s.to_string();
  }
}

// 'G' layers with their flags: one process, and TP 2 with SP (2 key heads: one per rank) and PP 2.
TEST(HybridArguments, GatedDeltaNetLayersAccepted) {
  for (const auto& [world, flags] : std::vector<std::pair<int64_t, std::vector<std::string>>>{
           {1, {}},
           {2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
           {2, {"--pipeline-model-parallel-size", "2"}}}) {
    testing::PretrainCli cli;
    const Status s = cli.parse_minimal(hybrid_gdn(flags), world);
    EXPECT_TRUE(s.ok()) << world << ": " << s.to_string();
  }
}

class HybridArgumentErrors : public ::testing::TestWithParam<FlagErrorCase> {};

TEST_P(HybridArgumentErrors, RefusedInOneLine) { testing::expect_one_line_error(GetParam()); }

INSTANTIATE_TEST_SUITE_P(
    Cases, HybridArgumentErrors,
    ::testing::Values(
        FlagErrorCase{hybrid("1", {"--tensor-model-parallel-size", "2"}), 2,
                      "--mamba-num-groups: expected a multiple of --tensor-model-parallel-size (2: each rank holds "
                      "ngroups / TP groups of the Mamba mixer), found 1"},
        FlagErrorCase{hybrid("2", {"--tensor-model-parallel-size", "4", "--sequence-parallel"}), 4,
                      "--mamba-num-groups: expected a multiple of --tensor-model-parallel-size (4"},
        FlagErrorCase{hybrid_pattern("ME", {}), 1,
                      "--hybrid-override-pattern: the MoE layers ('E') of 'ME' need --num-experts, found no "
                      "--num-experts"},
        FlagErrorCase{hybrid("2", {"--num-experts", "4"}), 1,
                      "--num-experts with --is-hybrid-model: expected MoE layers ('E') in --hybrid-override-pattern, "
                      "found none in 'M*'"},
        FlagErrorCase{hybrid_moe({"--moe-layer-freq", "[0,1]"}), 1,
                      "--moe-layer-freq with --is-hybrid-model: expected no --moe-layer-freq (a hybrid model's MoE "
                      "layers are the 'E' layers of --hybrid-override-pattern), found '[0,1]'"},
        FlagErrorCase{hybrid_moe({"--expert-model-parallel-size", "2", "--moe-tp-extend-ep"}), 2,
                      "--is-hybrid-model with --num-experts and --moe-tp-extend-ep: not supported yet"},
        FlagErrorCase{hybrid_moe({"--expert-model-parallel-size", "3"}), 3,
                      "--num-experts 4 must be divisible by --expert-model-parallel-size 3"},
        // 32-channel heads: 4, so 2 per TP rank for CP 4.
        FlagErrorCase{hybrid("2", {"--mamba-head-dim", "32", "--tensor-model-parallel-size", "2",
                                   "--context-parallel-size", "4"}),
                      8,
                      "--context-parallel-size: expected a divisor of the Mamba mixer's heads per tensor-parallel "
                      "rank (2 x --hidden-size / --mamba-head-dim / --tensor-model-parallel-size = 2: each TP x CP "
                      "rank scans whole heads), found 4"},
        // Hidden 96: 12 heads in 3 groups over CP 2.
        FlagErrorCase{hybrid("3", {"--hidden-size", "96", "--context-parallel-size", "2"}), 2,
                      "--mamba-num-groups: expected, per tensor-parallel rank (--mamba-num-groups / "
                      "--tensor-model-parallel-size = 3), a multiple or a divisor of --context-parallel-size (2"},
        FlagErrorCase{hybrid("2", {"--context-parallel-size", "2", "--context-parallel-algo", "adaptive_cp_algo"}), 2,
                      "--context-parallel-algo adaptive_cp_algo or hybrid_adaptive_cp_algo with --is-hybrid-model: "
                      "not supported yet"},
        // Megatron-Core main's other symbols: known, Megatron's mixing rule applied, then refused.
        FlagErrorCase{hybrid_pattern("M+", {}), 1,
                      "--hybrid-override-pattern: the multi-latent attention layers ('+') of 'M+': not supported yet "
                      "(Gale's hybrid stack builds M, G, *, - and E layers)"},
        // 'G' layers: the --linear-* sizes and what GDN needs of the model.
        FlagErrorCase{hybrid_pattern("MG", {"--normalization", "RMSNorm"}), 1,
                      "the Gated DeltaNet layers ('G') of --hybrid-override-pattern needs --swiglu (the convolution's "
                      "and the output gate's activation is the model's, SiLU), found GeLU"},
        FlagErrorCase{hybrid_pattern("MG", {"--swiglu"}), 1,
                      "the Gated DeltaNet layers ('G') of --hybrid-override-pattern with --normalization LayerNorm: "
                      "not supported yet (expected RMSNorm, the gated output norm's type)"},
        FlagErrorCase{hybrid_gdn({"--linear-num-value-heads", "3"}), 1,
                      "--linear-num-value-heads: expected a multiple of --linear-num-key-heads (2), found 3"},
        FlagErrorCase{hybrid_gdn({"--linear-key-head-dim", "0"}), 1,
                      "--linear-key-head-dim: expected a positive integer with the Gated DeltaNet layers ('G') of "
                      "--hybrid-override-pattern, found 0"},
        FlagErrorCase{hybrid_gdn({"--linear-attention-freq", "2"}), 1,
                      "--linear-attention-freq needs Gated DeltaNet layers ('G') in --hybrid-override-pattern"},
        FlagErrorCase{hybrid("2", {"--linear-num-key-heads", "2"}), 1,
                      "--linear-num-key-heads needs Gated DeltaNet layers ('G') in --hybrid-override-pattern"},
        FlagErrorCase{hybrid_gdn({"--linear-num-key-heads", "1", "--linear-num-value-heads", "2",
                                  "--tensor-model-parallel-size", "2"}),
                      2,
                      "--linear-num-key-heads: expected a multiple of --tensor-model-parallel-size (2: each rank "
                      "holds 1/TP of the Gated DeltaNet heads of the 'G' layers), found 1"},
        FlagErrorCase{hybrid_gdn({"--context-parallel-size", "2"}), 2,
                      "--context-parallel-size 2 with Gated DeltaNet layers ('G') in --hybrid-override-pattern: not "
                      "supported yet (expected 1)"},
        FlagErrorCase{hybrid_gdn({"--experimental-attention-variant", "gdn", "--linear-attention-freq", "2"}), 1,
                      "--experimental-attention-variant gdn with --is-hybrid-model: expected a hybrid model's Gated "
                      "DeltaNet layers as 'G' in --hybrid-override-pattern, found --experimental-attention-variant "
                      "gdn"},
        FlagErrorCase{hybrid_pattern("*D", {}), 1,
                      "--hybrid-override-pattern: expected attention layers ('*') or multi-latent / DeepSeek sparse "
                      "attention layers ('+', 'D'), not both in one model, found '*D'"},
        FlagErrorCase{hybrid_pattern("MX", {}), 1,
                      "--hybrid-override-pattern: 'X' is not a layer symbol: expected one of M (Mamba), G (Gated "
                      "DeltaNet), * (attention), + (multi-latent attention), D (DeepSeek sparse attention), - (MLP), "
                      "E (MoE)"}));

// Megatron main's --hybrid-layer-pattern: the same layers as --hybrid-override-pattern, --num-layers
// taken from the pattern's length; both flags is Megatron's error; '|' and '/' are refused.
TEST(HybridArguments, LayerPatternIsMegatronMainsSpelling) {
  testing::PretrainCli cli;
  const Status s = cli.parse_minimal(
      {"--is-hybrid-model", "--hybrid-layer-pattern", "M*-M", "--mamba-head-dim", "16", "--mamba-num-groups", "2"});
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(cli.args.model.num_layers, 4);  // minimal_pretrain_flags says 2: the pattern wins, as Megatron main
  EXPECT_EQ(cli.args.model.hybrid_override_pattern, "M*-M");
  testing::PretrainCli old;
  ASSERT_TRUE(old.parse_minimal(hybrid_pattern("M*", {})).ok());
  EXPECT_EQ(old.args.model.hybrid_override_pattern, "M*");
  for (const FlagErrorCase& e : std::vector<FlagErrorCase>{
           {{"--is-hybrid-model", "--hybrid-layer-pattern", "M*", "--hybrid-override-pattern", "M*", "--mamba-head-dim",
             "16"},
            1,
            "--hybrid-override-pattern and --hybrid-layer-pattern cannot both be specified. --hybrid-override-pattern "
            "is deprecated; use --hybrid-layer-pattern instead."},
           {{"--is-hybrid-model", "--hybrid-layer-pattern", "M*|M*", "--mamba-head-dim", "16"}, 2,
            "--hybrid-layer-pattern 'M*|M*': '|' pipeline-stage separators: not supported yet (a pattern of layer "
            "symbols only)"},
           {{"--is-hybrid-model", "--hybrid-layer-pattern", "M*/M", "--mamba-head-dim", "16"}, 1,
            "--hybrid-layer-pattern 'M*/M': '/' multi-token-prediction separators: not supported yet (a pattern of "
            "layer symbols only)"},
           {{"--hybrid-layer-pattern", "M*"}, 1, "--hybrid-layer-pattern needs --is-hybrid-model"}})
    testing::expect_one_line_error(e);
}

}  // namespace
}  // namespace gale
