// The hybrid Mamba model's parallel layouts at the argument level: tensor and sequence parallelism
// accepted when the TP size divides the mixer's groups (Megatron's MambaMixer asserts), refused in
// one line naming the flags otherwise; what the Mamba layers still lack stays refused.
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
                      "--is-hybrid-model with --context-parallel-size > 1: not supported yet (found 2)"}));

}  // namespace
}  // namespace gale
