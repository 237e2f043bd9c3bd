// MindSpeed's --moe-fb-overlap in the registry: an implemented level-2 feature, what it installs (the
// op table's switch that DualPipeV's executor reads) and every refusal as one line naming the flags.
#include <gtest/gtest.h>

#include "features/resolved_features.h"

namespace gale {
namespace {

const std::vector<std::string> kOk = {"--num-layers", "4", "--num-experts", "4", "--moe-token-dispatcher-type",
                                      "alltoall", "--moe-grouped-gemm", "--pipeline-model-parallel-size", "2",
                                      "--schedules-method", "dualpipev", "--moe-fb-overlap"};

// `base` without `flag` (and the value after it when `with_value`).
std::vector<std::string> without(std::vector<std::string> base, const std::string& flag, bool with_value) {
  for (size_t i = 0; i < base.size(); ++i)
    if (base[i] == flag) {
      base.erase(base.begin() + static_cast<std::ptrdiff_t>(i), base.begin() + static_cast<std::ptrdiff_t>(i) + (with_value ? 2 : 1));
      break;
    }
  return base;
}

void expect_error(const std::vector<std::string>& argv, const std::string& part) {
  expect_one_line_refusal(argv, part);
  EXPECT_NE(ResolvedFeatures(argv).status.message().find("--moe-fb-overlap"), std::string::npos);
}

TEST(MoeFbOverlapFeature, ImplementedLevelTwoOffByDefault) {
  ResolvedFeatures r({});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  const Feature* f = r.registry->find("moe-fb-overlap");
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->implemented());
  EXPECT_EQ(f->level(), 2);
  EXPECT_FALSE(r.registry->active("moe-fb-overlap"));
  EXPECT_FALSE(r.ops.moe_fb_overlap);
}

TEST(MoeFbOverlapFeature, InstallsTheSwitchUnderDualPipeV) {
  ResolvedFeatures r(kOk);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_TRUE(r.registry->active("moe-fb-overlap"));
  EXPECT_TRUE(r.ops.moe_fb_overlap);
  ResolvedFeatures etp1 = resolve(kOk, {"--tensor-model-parallel-size", "2", "--expert-tensor-parallel-size", "1"});
  ASSERT_TRUE(etp1.status.ok()) << etp1.status.to_string();
}

TEST(MoeFbOverlapFeature, RefusesWhatMindSpeedRefuses) {
  expect_error({"--moe-fb-overlap", "--schedules-method", "dualpipev"}, "found no --num-experts");
  std::vector<std::string> allgather = kOk;
  allgather.insert(allgather.end(), {"--moe-token-dispatcher-type", "allgather"});
  expect_error(allgather, "expected --moe-token-dispatcher-type alltoall (as MindSpeed), found allgather");
  expect_error(without(kOk, "--moe-grouped-gemm", false), "found no --moe-grouped-gemm");
  std::vector<std::string> tp2 = kOk;
  tp2.insert(tp2.end(), {"--tensor-model-parallel-size", "2"});
  expect_error(tp2, "expert-tensor-parallel size 1");
  std::vector<std::string> more = kOk;
  more.push_back("--overlap-grad-reduce");
  expect_error(more, "conflicts with --overlap-grad-reduce");
  more = kOk;
  more.insert(more.end(), {"--moe-alltoall-overlap-comm", "--moe-permutation-async-comm"});
  expect_error(more, "conflicts with --moe-alltoall-overlap-comm");
}

TEST(MoeFbOverlapFeature, OnlyDualPipeVSupported) {
  const std::vector<std::string> plain = without(kOk, "--schedules-method", true);
  expect_error(plain, "expected --schedules-method dualpipev");
  expect_error(plain, "found no --schedules-method");
  std::vector<std::string> vpp = plain;
  vpp.insert(vpp.end(), {"--num-layers-per-virtual-pipeline-stage", "1"});
  expect_error(vpp, "interleaved 1F1B schedule (--num-layers-per-virtual-pipeline-stage) is not supported yet");
}

}  // namespace
}  // namespace gale
