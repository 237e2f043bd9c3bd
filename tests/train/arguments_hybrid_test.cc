// The hybrid Mamba model's parallel layouts at the argument level: tensor and sequence parallelism
// accepted when the TP size divides the mixer's groups (Megatron's MambaMixer asserts), refused in
// one line naming the flags otherwise; what the Mamba layers still lack stays refused. MoE layers
// ('E'): accepted with --num-experts, with expert and tensor parallelism, their flag errors in one line.
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

// 'E' layers with --num-experts: one process, EP 2 over the DP ranks, TP 2 with SP (MoE under TP needs it).
std::vector<std::string> hybrid_pattern(const std::string& pattern, std::vector<std::string> extra) {
  std::vector<std::string> flags = {"--is-hybrid-model", "--hybrid-override-pattern", pattern, "--mamba-head-dim", "16",
                                    "--mamba-num-groups", "2"};
  flags.insert(flags.end(), extra.begin(), extra.end());
  return flags;
}
std::vector<std::string> hybrid_moe(std::vector<std::string> extra) {
  extra.insert(extra.begin(), {"--num-experts", "4", "--moe-router-topk", "2"});
  return hybrid_pattern("ME", extra);
}

TEST(HybridArguments, MoeLayersAcceptedWithExpertAndTensorParallelism) {
  for (const auto& [world, flags] : std::vector<std::pair<int64_t, std::vector<std::string>>>{
           {1, {}},
           {2, {"--expert-model-parallel-size", "2"}},
           {2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
           {4, {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--expert-model-parallel-size", "2"}}}) {
    testing::PretrainCli cli;
    const Status s = cli.parse_minimal(hybrid_moe(flags), world);
    ASSERT_TRUE(s.ok()) << "world " << world << ": " << s.to_string();
    EXPECT_EQ(cli.args.moe.layer_pattern, (std::vector<int>{0, 1})) << "the 'E' layer is the MoE layer";
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
        FlagErrorCase{hybrid("2", {"--context-parallel-size", "2"}), 2,
                      "--is-hybrid-model with --context-parallel-size > 1: not supported yet (found 2)"},
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
                      "--num-experts 4 must be divisible by --expert-model-parallel-size 3"}));

}  // namespace
}  // namespace gale
