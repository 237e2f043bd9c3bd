// MindSpeed's --unaligned-linear in the registry: implemented (no longer a planned flag), a level-0
// parallel feature (it decides which rank holds which heads), active at every optimization level
// when given.
#include <gtest/gtest.h>

#include "features/resolved_features.h"

namespace gale {
namespace {

TEST(UnalignedLinearFeature, ImplementedLevelZeroParallelFeature) {
  ResolvedFeatures r({});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  const Feature* f = r.registry->find("unaligned-linear");
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->implemented());
  EXPECT_EQ(f->level(), 0);
  EXPECT_EQ(f->module(), FeatureModule::kParallel);
  EXPECT_EQ(f->flag(), "--unaligned-linear");
  EXPECT_FALSE(r.registry->active("unaligned-linear"));
}

TEST(UnalignedLinearFeature, ActiveAtEveryLevelWhenGiven) {
  for (const char* level : {"0", "1", "2"}) {
    ResolvedFeatures r({"--optimization-level", level, "--unaligned-linear"});
    ASSERT_TRUE(r.status.ok()) << r.status.to_string();
    EXPECT_TRUE(r.registry->active("unaligned-linear")) << "level " << level;
    EXPECT_TRUE(r.notices.empty());
  }
}

}  // namespace
}  // namespace gale
