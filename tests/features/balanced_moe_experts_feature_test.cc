// MindSpeed's --balanced-moe-experts in the registry: an implemented level-2 feature, what it
// installs (the hot expert number and the transfer groups, reduced as MindSpeed reduces them) and
// every refusal as one line naming the flags.
#include <gtest/gtest.h>

#include "features/resolved_features.h"

namespace gale {
namespace {

const std::vector<std::string> kOk = {"--num-experts", "8", "--moe-token-dispatcher-type", "alltoall",
                                      "--moe-grouped-gemm", "--expert-model-parallel-size", "2",
                                      "--balanced-moe-experts"};

std::vector<std::string> with(std::vector<std::string> base, const std::vector<std::string>& more) {
  base.insert(base.end(), more.begin(), more.end());
  return base;
}

std::vector<std::string> without(std::vector<std::string> base, const std::string& flag) {
  for (size_t i = 0; i < base.size(); ++i)
    if (base[i] == flag) {
      base.erase(base.begin() + static_cast<std::ptrdiff_t>(i));
      break;
    }
  return base;
}

void expect_error(const std::vector<std::string>& argv, const std::string& part, const std::string& flag) {
  ResolvedFeatures r(argv);
  ASSERT_FALSE(r.status.ok()) << part;
  EXPECT_NE(r.status.message().find(part), std::string::npos) << r.status.message();
  EXPECT_NE(r.status.message().find(flag), std::string::npos) << r.status.message();
  EXPECT_EQ(r.status.message().find('\n'), std::string::npos) << r.status.message();
}

TEST(BalancedMoeExpertsFeature, ImplementedLevelTwoOffByDefault) {
  ResolvedFeatures r({});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  const Feature* f = r.registry->find("balanced-moe-experts");
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->implemented());
  EXPECT_EQ(f->level(), 2);
  EXPECT_FALSE(r.registry->active("balanced-moe-experts"));
  EXPECT_EQ(r.ops.moe_hot_experts, 0);
}

TEST(BalancedMoeExpertsFeature, InstallsMindSpeedsDefaultsAndReducesTheGroups) {
  ResolvedFeatures r(kOk);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_TRUE(r.registry->active("balanced-moe-experts"));
  EXPECT_EQ(r.ops.moe_hot_experts, 3);  // MindSpeed's defaults: N = 3, M = 3
  EXPECT_EQ(r.ops.moe_hot_expert_groups, 3);
  ResolvedFeatures two(with(kOk, {"--balanced-moe-hot-expert-num", "2", "--trans-hot-expert-group-num", "5"}));
  ASSERT_TRUE(two.status.ok()) << two.status.to_string();
  EXPECT_EQ(two.ops.moe_hot_experts, 2);
  EXPECT_EQ(two.ops.moe_hot_expert_groups, 2);  // M > N: reduced to N (as MindSpeed)
  ResolvedFeatures many(with(kOk, {"--num-experts", "64", "--balanced-moe-hot-expert-num", "12",
                                   "--trans-hot-expert-group-num", "12"}));
  ASSERT_TRUE(many.status.ok()) << many.status.to_string();
  EXPECT_EQ(many.ops.moe_hot_expert_groups, 8);  // MindSpeed's MAX_GROUP_NUM
  ResolvedFeatures fb(with(kOk, {"--num-layers", "4", "--pipeline-model-parallel-size", "2", "--schedules-method",
                                 "dualpipev", "--moe-fb-overlap"}));
  ASSERT_TRUE(fb.status.ok()) << fb.status.to_string();
  EXPECT_TRUE(fb.ops.moe_fb_overlap);
}

TEST(BalancedMoeExpertsFeature, RefusesWhatMindSpeedRefuses) {
  const std::string f = "--balanced-moe-experts";
  expect_error({"--balanced-moe-experts"}, "found no --num-experts", f);
  expect_error(with(kOk, {"--moe-token-dispatcher-type", "allgather"}),
               "expected --moe-token-dispatcher-type alltoall (as MindSpeed), found allgather", f);
  expect_error(without(kOk, "--moe-grouped-gemm"), "found no --moe-grouped-gemm", f);
  expect_error(with(kOk, {"--moe-expert-capacity-factor", "1.5"}), "conflicts with --moe-expert-capacity-factor", f);
  expect_error(with(kOk, {"--balanced-moe-hot-expert-num", "5"}),
               "expected 1 to num_experts / expert-model-parallel-size = 8 / 2 = 4 (as MindSpeed), found 5",
               "--balanced-moe-hot-expert-num");
  expect_error(with(kOk, {"--balanced-moe-hot-expert-num", "0"}), "found 0", "--balanced-moe-hot-expert-num");
  expect_error(with(kOk, {"--trans-hot-expert-group-num", "0"}), "expected a positive integer, found 0",
               "--trans-hot-expert-group-num");
}

TEST(BalancedMoeExpertsFeature, RefusesWhatGaleDoesNotSupport) {
  const std::string f = "--balanced-moe-experts";
  expect_error(with(kOk, {"--expert-model-parallel-size", "1"}),
               "expected --expert-model-parallel-size greater than 1, found 1", f);
  expect_error(with(kOk, {"--tensor-model-parallel-size", "2"}), "expert-tensor-parallel size 1", f);
  expect_error(with(kOk, {"--enable-expert-placement"}), "--enable-expert-placement: not supported yet", f);
}

TEST(BalancedMoeExpertsFeature, SubFlagsNeedTheFeature) {
  expect_error(with(without(kOk, "--balanced-moe-experts"), {"--balanced-moe-hot-expert-num", "2"}),
               "needs --balanced-moe-experts, found it off", "--balanced-moe-hot-expert-num");
  expect_error(with(without(kOk, "--balanced-moe-experts"), {"--trans-hot-expert-group-num", "2"}),
               "needs --balanced-moe-experts, found it off", "--trans-hot-expert-group-num");
}

}  // namespace
}  // namespace gale
