// Megatron's --mla-down-proj-fusion in the registry: a level-2 fused-compute feature that installs
// the fused MLA down projection (OpTable::mla_down_proj_fusion) only when asked for, and not below
// --optimization-level 2 (where the unfused reference runs on the same parameters).
#include <gtest/gtest.h>

#include "features/resolved_features.h"

namespace gale {
namespace {

const std::vector<std::string> kMla = {"--multi-latent-attention", "--q-lora-rank", "8"};

TEST(MlaDownProjFusionFeature, LevelTwoFusedComputeFeature) {
  ResolvedFeatures r(kMla);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  const Feature* f = r.registry->find("mla-down-proj-fusion");
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->implemented());
  EXPECT_EQ(f->level(), 2);
  EXPECT_EQ(f->module(), FeatureModule::kFusedCompute);
  EXPECT_EQ(f->flag(), "--mla-down-proj-fusion");
  EXPECT_FALSE(r.registry->active("mla-down-proj-fusion"));
  EXPECT_FALSE(r.ops.mla_down_proj_fusion);
}

TEST(MlaDownProjFusionFeature, InstalledWhenAskedAndNotBelowLevelTwo) {
  ResolvedFeatures r = resolve(kMla, {"--mla-down-proj-fusion"});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_TRUE(r.registry->active("mla-down-proj-fusion"));
  EXPECT_TRUE(r.ops.mla_down_proj_fusion);
  EXPECT_EQ(r.impl("mla_down_proj"), "fused");
  for (const char* level : {"0", "1"}) {
    ResolvedFeatures low = resolve(kMla, {"--mla-down-proj-fusion", "--optimization-level", level});
    ASSERT_TRUE(low.status.ok()) << low.status.to_string();
    EXPECT_FALSE(low.registry->active("mla-down-proj-fusion"));
    EXPECT_FALSE(low.ops.mla_down_proj_fusion) << "level " << level;
    ASSERT_EQ(low.notices.size(), 1u);
    EXPECT_NE(low.notices[0].find("--mla-down-proj-fusion is not active: it needs --optimization-level 2"),
              std::string::npos)
        << low.notices[0];
  }
}

}  // namespace
}  // namespace gale
