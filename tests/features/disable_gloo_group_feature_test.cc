// MindSpeed's --disable-gloo-group in the registry: implemented (no longer a planned flag), level 2,
// active when given, reported inactive with its reason below level 2, and --hccl-slice-size checked.
// That the distributed optimizer's state is written by each rank without a gather is tested where
// the checkpoints are: tests/parallel/reshard_mpi_test.cc checks which ranks write which state.
#include <gtest/gtest.h>

#include "features/resolved_features.h"

namespace gale {
namespace {

TEST(DisableGlooGroupFeature, ImplementedLevelTwoCommunicationFeature) {
  ResolvedFeatures r({});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  const Feature* f = r.registry->find("disable-gloo-group");
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->implemented());
  EXPECT_EQ(f->level(), 2);
  EXPECT_EQ(f->module(), FeatureModule::kCommunication);
  EXPECT_EQ(f->flag(), "--disable-gloo-group");
  EXPECT_FALSE(r.registry->active("disable-gloo-group"));
}

TEST(DisableGlooGroupFeature, ActiveWhenGivenWithItsSliceSize) {
  ResolvedFeatures r({"--disable-gloo-group", "--hccl-slice-size", "4096", "--use-distributed-optimizer"});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_TRUE(r.registry->active("disable-gloo-group"));
  EXPECT_TRUE(r.notices.empty());
}

TEST(DisableGlooGroupFeature, BelowLevelTwoItSaysWhyItIsInactive) {
  ResolvedFeatures r({"--optimization-level", "1", "--disable-gloo-group"});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_FALSE(r.registry->active("disable-gloo-group"));
  ASSERT_EQ(r.notices.size(), 1u);
  EXPECT_NE(r.notices[0].find("--disable-gloo-group is not active: it needs --optimization-level 2 (given 1)"),
            std::string::npos)
      << r.notices[0];
}

TEST(DisableGlooGroupFeature, RefusesANonPositiveSliceSize) {
  ResolvedFeatures r({"--disable-gloo-group", "--hccl-slice-size", "0"});
  EXPECT_FALSE(r.status.ok());
  EXPECT_NE(r.status.message().find("--hccl-slice-size: expected a positive integer, found 0"), std::string::npos)
      << r.status.message();
}

}  // namespace
}  // namespace gale
