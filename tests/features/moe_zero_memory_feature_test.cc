// MindSpeed's --moe-alltoall-overlap-comm and --moe-zero-memory in the registry: implemented level-2
// features, what they install (the op table's overlap switch, the recompute plan's level and
// level1 layer count), and every refusal as one line naming the flags.
#include <gtest/gtest.h>

#include "features/resolved_features.h"

namespace gale {
namespace {

const std::vector<std::string> kMoe = {"--num-layers", "4", "--num-experts", "4", "--moe-token-dispatcher-type",
                                       "alltoall", "--moe-grouped-gemm", "--moe-permutation-async-comm"};

std::vector<std::string> with(std::vector<std::string> base, const std::vector<std::string>& more) {
  base.insert(base.end(), more.begin(), more.end());
  return base;
}

TEST(MoeZeroMemoryFeature, ImplementedLevelTwoFeaturesOffByDefault) {
  ResolvedFeatures r({});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  for (const char* name : {"moe-zero-memory", "moe-alltoall-overlap-comm"}) {
    const Feature* f = r.registry->find(name);
    ASSERT_NE(f, nullptr) << name;
    EXPECT_TRUE(f->implemented()) << name;
    EXPECT_EQ(f->level(), 2) << name;
    EXPECT_FALSE(r.registry->active(name)) << name;
  }
  EXPECT_FALSE(r.ops.moe_alltoall_overlap);
  EXPECT_EQ(r.recompute.moe_zero_memory, MoeZeroMemory::kOff);
}

TEST(MoeZeroMemoryFeature, InstallsTheOverlapAndTheLevels) {
  ResolvedFeatures overlap = resolve(kMoe, {"--moe-alltoall-overlap-comm"});
  ASSERT_TRUE(overlap.status.ok()) << overlap.status.to_string();
  EXPECT_TRUE(overlap.ops.moe_alltoall_overlap);
  EXPECT_EQ(overlap.recompute.moe_zero_memory, MoeZeroMemory::kOff);
  ResolvedFeatures level0 = resolve(kMoe, {"--moe-alltoall-overlap-comm", "--moe-zero-memory", "level0"});
  ASSERT_TRUE(level0.status.ok()) << level0.status.to_string();
  EXPECT_EQ(level0.recompute.moe_zero_memory, MoeZeroMemory::kLevel0);
  ResolvedFeatures level1 = resolve(kMoe, {"--moe-alltoall-overlap-comm", "--moe-zero-memory", "level1",
                                           "--moe-zero-memory-num-layers", "2"});
  ASSERT_TRUE(level1.status.ok()) << level1.status.to_string();
  EXPECT_EQ(level1.recompute.moe_zero_memory, MoeZeroMemory::kLevel1);
  EXPECT_EQ(level1.recompute.moe_zero_memory_level1_layers, 2);
  // 0 (as MindSpeed's falsy count) and unset: level1 in every layer.
  for (const std::vector<std::string>& count : {std::vector<std::string>{"--moe-zero-memory-num-layers", "0"},
                                                std::vector<std::string>{}}) {
    ResolvedFeatures all = resolve(with(kMoe, {"--moe-alltoall-overlap-comm", "--moe-zero-memory", "level1"}), count);
    ASSERT_TRUE(all.status.ok()) << all.status.to_string();
    EXPECT_EQ(all.recompute.moe_zero_memory_level1_layers, RecomputePlan::kAllLayers);
  }
  // Below --optimization-level 2 both stay off, with a notice.
  ResolvedFeatures low = resolve(kMoe, {"--optimization-level", "1", "--moe-alltoall-overlap-comm", "--moe-zero-memory",
                                        "level1"});
  ASSERT_TRUE(low.status.ok()) << low.status.to_string();
  EXPECT_FALSE(low.ops.moe_alltoall_overlap);
  EXPECT_EQ(low.recompute.moe_zero_memory, MoeZeroMemory::kOff);
  EXPECT_EQ(low.notices.size(), 2u);
}

TEST(MoeZeroMemoryFeature, OverlapRules) {
  expect_one_line_refusal({"--moe-alltoall-overlap-comm"}, {}, "needs --num-experts");
  expect_one_line_refusal({"--num-experts", "4", "--moe-grouped-gemm", "--moe-permutation-async-comm"},
               {"--moe-alltoall-overlap-comm"}, "expected --moe-token-dispatcher-type alltoall (as MindSpeed), found allgather");
  expect_one_line_refusal({"--num-experts", "4", "--moe-token-dispatcher-type", "alltoall", "--moe-permutation-async-comm"},
               {"--moe-alltoall-overlap-comm"}, "found no --moe-grouped-gemm");
  expect_one_line_refusal({"--num-experts", "4", "--moe-token-dispatcher-type", "alltoall", "--moe-grouped-gemm"},
               {"--moe-alltoall-overlap-comm"}, "found no --moe-permutation-async-comm");
}

TEST(MoeZeroMemoryFeature, ZeroMemoryRules) {
  expect_one_line_refusal(kMoe, {"--moe-zero-memory", "level0"}, "--moe-zero-memory needs --moe-alltoall-overlap-comm");
  expect_one_line_refusal(kMoe, {"--moe-alltoall-overlap-comm", "--moe-zero-memory-num-layers", "1"},
               "--moe-zero-memory-num-layers needs --moe-zero-memory level0 or level1, found disable");
  expect_one_line_refusal(kMoe, {"--moe-alltoall-overlap-comm", "--moe-zero-memory", "level1", "--moe-zero-memory-num-layers", "5"},
               "expected 0 to the layers per pipeline stage 4");
  expect_one_line_refusal(kMoe, {"--moe-alltoall-overlap-comm", "--moe-zero-memory", "level1", "--pipeline-model-parallel-size", "2",
                      "--moe-zero-memory-num-layers", "3"},
               "expected 0 to the layers per pipeline stage 2");
  expect_one_line_refusal(kMoe, {"--moe-alltoall-overlap-comm", "--moe-zero-memory", "level1", "--moe-zero-memory-num-layers", "-2"},
               "found -2");
  expect_one_line_refusal({"--num-layers", "4"}, {"--moe-zero-memory", "level0"}, "--moe-zero-memory needs --num-experts");
  ResolvedFeatures bad_level = resolve(kMoe, {"--moe-alltoall-overlap-comm", "--moe-zero-memory", "level2"});
  EXPECT_FALSE(bad_level.status.ok());
}

}  // namespace
}  // namespace gale
