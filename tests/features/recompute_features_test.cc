// The memory features --recompute-activation-function and --recompute-norm: what each command
// line installs into the RecomputePlan, their layer counts, errors and level gating.
#include <gtest/gtest.h>

#include "features/resolved_features.h"

namespace gale {
namespace {

TEST(RecomputeFeatures, OffUnlessRequested) {
  ResolvedFeatures r({});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(r.recompute.activation_layers, 0);
  EXPECT_EQ(r.recompute.norm_layers, 0);
  EXPECT_FALSE(r.registry->active("recompute-activation-function"));
}

TEST(RecomputeFeatures, EveryLayerByDefault) {
  ResolvedFeatures r({"--recompute-activation-function", "--recompute-norm"});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(r.recompute.activation_layers, RecomputePlan::kAllLayers);
  EXPECT_EQ(r.recompute.norm_layers, RecomputePlan::kAllLayers);
  EXPECT_TRUE(r.registry->active("recompute-activation-function"));
  EXPECT_TRUE(r.registry->active("recompute-norm"));
  EXPECT_TRUE(r.notices.empty());
}

TEST(RecomputeFeatures, LayerCounts) {
  ResolvedFeatures r({"--recompute-activation-function", "--recompute-activation-function-num-layers", "3",
                      "--recompute-norm", "--recompute-norm-num-layers", "1"});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(r.recompute.activation_layers, 3);
  EXPECT_EQ(r.recompute.norm_layers, 1);
}

TEST(RecomputeFeatures, LayerCountWithoutTheFeatureIsAnError) {
  ResolvedFeatures r({"--recompute-norm-num-layers", "2"});
  ASSERT_FALSE(r.status.ok());
  EXPECT_EQ(r.status.message(), "--recompute-norm-num-layers requires --recompute-norm");
  EXPECT_EQ(r.recompute.norm_layers, 0);
}

TEST(RecomputeFeatures, LayerCountBelowOneIsAnError) {
  ResolvedFeatures r({"--recompute-activation-function", "--recompute-activation-function-num-layers", "0"});
  ASSERT_FALSE(r.status.ok());
  EXPECT_EQ(r.status.message(),
            "--recompute-activation-function-num-layers: expected a number of layers >= 1, found 0");
}

TEST(RecomputeFeatures, BelowLevelTwoTheyAreNotActiveAndSaySo) {
  ResolvedFeatures r({"--optimization-level", "1", "--recompute-activation-function"});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(r.recompute.activation_layers, 0);
  ASSERT_EQ(r.notices.size(), 1u);
  EXPECT_EQ(r.notices[0], "--recompute-activation-function is not active: it needs --optimization-level 2 (given 1)");
}

}  // namespace
}  // namespace gale
