// MindSpeed's --context-parallel-kv-cache-policy in the registry: an implemented level-0 parallel feature, active at every optimization level when given.
#include <gtest/gtest.h>

#include "features/resolved_features.h"

namespace gale {
namespace {

TEST(ContextParallelKvCacheFeature, ImplementedLevelZeroParallelFeature) {
  ResolvedFeatures r({});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  const Feature* f = r.registry->find("context-parallel-kv-cache-policy");
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->implemented());
  EXPECT_EQ(f->level(), 0);
  EXPECT_EQ(f->module(), FeatureModule::kParallel);
  EXPECT_EQ(f->flag(), "--context-parallel-kv-cache-policy");
  EXPECT_FALSE(r.registry->active("context-parallel-kv-cache-policy"));
}

TEST(ContextParallelKvCacheFeature, ActiveAtEveryLevelWhenGiven) {
  for (const char* level : {"0", "1", "2"})
    for (const char* policy : {"full", "half"}) {
      ResolvedFeatures r({"--optimization-level", level, "--context-parallel-size", "2",
                          "--context-parallel-kv-cache-policy", policy});
      ASSERT_TRUE(r.status.ok()) << r.status.to_string();
      EXPECT_TRUE(r.registry->active("context-parallel-kv-cache-policy")) << "level " << level << ", " << policy;
      EXPECT_TRUE(r.notices.empty());
    }
}

TEST(ContextParallelKvCacheFeature, OtherValuesAreRefusedByTheParser) {
  ResolvedFeatures r({"--context-parallel-size", "2", "--context-parallel-kv-cache-policy", "quarter"});
  EXPECT_FALSE(r.status.ok());
  EXPECT_NE(r.status.message().find("--context-parallel-kv-cache-policy"), std::string::npos) << r.status.message();
}

}  // namespace
}  // namespace gale
