// MindSpeed's --moe-alltoall-mc2 in the registry: an implemented level-2 feature, the op-table
// switch it installs, and every refusal as one line naming the flags (what was expected, what was
// found).
#include <gtest/gtest.h>

#include "features/resolved_features.h"

namespace gale {
namespace {

const std::vector<std::string> kMoe = {"--num-layers", "4", "--num-experts", "4", "--moe-token-dispatcher-type",
                                       "alltoall", "--moe-grouped-gemm", "--moe-permutation-async-comm"};

TEST(MoeAlltoallMc2Feature, ImplementedAndOffByDefault) {
  ResolvedFeatures r({});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  const Feature* f = r.registry->find("moe-alltoall-mc2");
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->implemented());
  EXPECT_EQ(f->level(), 2);
  EXPECT_EQ(f->flag(), "--moe-alltoall-mc2");
  EXPECT_FALSE(r.registry->active("moe-alltoall-mc2"));
  EXPECT_FALSE(r.ops.moe_alltoall_mc2);
}

TEST(MoeAlltoallMc2Feature, InstallsTheFusedDispatcher) {
  ResolvedFeatures r = resolve(kMoe, {"--moe-alltoall-mc2"});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_TRUE(r.ops.moe_alltoall_mc2);
  EXPECT_FALSE(r.ops.moe_alltoall_overlap);
  // what Gale adds to MindSpeed's dropless-only rule: token dropping, with or without padding;
  // tensor parallelism with expert TP 1
  for (const std::vector<std::string>& more :
       {std::vector<std::string>{"--moe-expert-capacity-factor", "1.0"},
        std::vector<std::string>{"--moe-expert-capacity-factor", "1.0", "--moe-pad-expert-input-to-capacity"},
        std::vector<std::string>{"--tensor-model-parallel-size", "2", "--sequence-parallel",
                                 "--expert-tensor-parallel-size", "1"},
        std::vector<std::string>{"--moe-shared-expert-intermediate-size", "32", "--moe-shared-expert-overlap"}}) {
    std::vector<std::string> flags = {"--moe-alltoall-mc2"};
    flags.insert(flags.end(), more.begin(), more.end());
    ResolvedFeatures ok = resolve(kMoe, flags);
    EXPECT_TRUE(ok.status.ok()) << ok.status.to_string();
    EXPECT_TRUE(ok.ops.moe_alltoall_mc2);
  }
  // Below --optimization-level 2 it stays off, with a notice.
  ResolvedFeatures low = resolve(kMoe, {"--optimization-level", "1", "--moe-alltoall-mc2"});
  ASSERT_TRUE(low.status.ok()) << low.status.to_string();
  EXPECT_FALSE(low.ops.moe_alltoall_mc2);
  EXPECT_EQ(low.notices.size(), 1u);
}

TEST(MoeAlltoallMc2Feature, Requirements) {
  expect_one_line_refusal({"--num-layers", "4"}, {"--moe-alltoall-mc2"}, "--moe-alltoall-mc2 needs --num-experts");
  expect_one_line_refusal({"--num-layers", "4", "--num-experts", "4"}, {"--moe-alltoall-mc2"},
               "--moe-alltoall-mc2: expected --moe-token-dispatcher-type alltoall (as MindSpeed), found allgather");
  expect_one_line_refusal(kMoe, {"--moe-alltoall-mc2", "--tensor-model-parallel-size", "2", "--sequence-parallel"},
               "--moe-alltoall-mc2 needs expert-tensor-parallel size 1");
  expect_one_line_refusal(kMoe, {"--moe-alltoall-mc2", "--tensor-model-parallel-size", "2", "--sequence-parallel",
                      "--expert-tensor-parallel-size", "2"},
               "found 2");
}

TEST(MoeAlltoallMc2Feature, ConflictsAsMindSpeed) {
  expect_one_line_refusal(kMoe, {"--moe-alltoall-mc2", "--moe-alltoall-overlap-comm"},
               "--moe-alltoall-mc2 conflicts with --moe-alltoall-overlap-comm (as MindSpeed), found both");
  expect_one_line_refusal(kMoe, {"--moe-alltoall-mc2", "--moe-fb-overlap"}, "conflicts with --moe-fb-overlap");
  // (refused by those features' own rules first: the all-gather dispatcher; no MoE under MC2 linears)
  expect_one_line_refusal(kMoe, {"--moe-alltoall-mc2", "--moe-allgather-overlap-comm"}, "--moe-allgather-overlap-comm");
  expect_one_line_refusal(kMoe, {"--moe-alltoall-mc2", "--use-ascend-mc2", "--tensor-model-parallel-size", "2",
                      "--sequence-parallel", "--expert-tensor-parallel-size", "1"},
               "--use-ascend-mc2");
  expect_one_line_refusal(kMoe, {"--moe-alltoall-mc2", "--moe-tp-extend-ep"}, "conflicts with --moe-tp-extend-ep");
  // --moe-zero-memory needs --moe-alltoall-overlap-comm, which conflicts
  expect_one_line_refusal(kMoe, {"--moe-alltoall-mc2", "--moe-alltoall-overlap-comm", "--moe-zero-memory", "level0"},
               "conflicts with --moe-alltoall-overlap-comm");
}

TEST(MoeAlltoallMc2Feature, NotSupportedYet) {
  expect_one_line_refusal(kMoe, {"--moe-alltoall-mc2", "--enable-expert-placement", "--expert-model-parallel-size", "2"},
               "--moe-alltoall-mc2 with --enable-expert-placement: not supported yet");
  expect_one_line_refusal(kMoe, {"--moe-alltoall-mc2", "--balanced-moe-experts", "--balanced-moe-hot-expert-num", "1",
                      "--trans-hot-expert-group-num", "1", "--expert-model-parallel-size", "2"},
               "--moe-alltoall-mc2 with --balanced-moe-experts: not supported yet");
}

}  // namespace
}  // namespace gale
