// MindSpeed's --moe-tp-extend-ep in the registry: implemented (no longer a planned flag), level 0
// (it decides which rank holds which expert), active at every optimization level when given, and
// with the tensor-parallel size it makes the expert-parallel feature active (TP x EP expert ranks).
#include <gtest/gtest.h>

#include "features/resolved_features.h"

namespace gale {
namespace {

TEST(MoeTpExtendEpFeature, ImplementedLevelZeroKeyScenarioFeature) {
  ResolvedFeatures r({});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  const Feature* f = r.registry->find("moe-tp-extend-ep");
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->implemented());
  EXPECT_EQ(f->level(), 0);
  EXPECT_EQ(f->module(), FeatureModule::kKeyScenarios);
  EXPECT_EQ(f->flag(), "--moe-tp-extend-ep");
  EXPECT_FALSE(r.registry->active("moe-tp-extend-ep"));
}

TEST(MoeTpExtendEpFeature, ActiveAtEveryLevelWithTheExpertParallelFeature) {
  for (const char* level : {"0", "1", "2"}) {
    ResolvedFeatures r({"--optimization-level", level, "--num-experts", "4", "--tensor-model-parallel-size", "2",
                        "--moe-tp-extend-ep", "--moe-permutation-async-comm", "--moe-grouped-gemm"});
    ASSERT_TRUE(r.status.ok()) << r.status.to_string();
    EXPECT_TRUE(r.registry->active("moe-tp-extend-ep")) << "level " << level;
    EXPECT_TRUE(r.registry->active("expert-parallel")) << "level " << level;
    EXPECT_TRUE(r.notices.empty());
  }
  ResolvedFeatures tp_only({"--num-experts", "4", "--tensor-model-parallel-size", "2"});
  ASSERT_TRUE(tp_only.status.ok()) << tp_only.status.to_string();
  EXPECT_FALSE(tp_only.registry->active("expert-parallel"));
}

}  // namespace
}  // namespace gale
