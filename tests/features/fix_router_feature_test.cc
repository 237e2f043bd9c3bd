// MindSpeed's --fix-router in the registry and its argument rules: level 0 (active at every
// optimization level), MoE only, and MindSpeed's requirement of expert parallelism.
#include <gtest/gtest.h>

#include "features/resolved_features.h"
#include "train/pretrain_cli.h"

namespace gale {
namespace {

TEST(FixRouterFeature, LevelZeroKeyScenarioFeatureActiveWhenGiven) {
  for (const char* level : {"0", "2"}) {
    ResolvedFeatures r({"--optimization-level", level, "--num-experts", "4", "--expert-model-parallel-size", "2",
                        "--fix-router"});
    ASSERT_TRUE(r.status.ok()) << r.status.to_string();
    EXPECT_TRUE(r.registry->active("fix-router")) << "level " << level;
    EXPECT_TRUE(r.args.moe.fix_router);
  }
  ResolvedFeatures off({"--num-experts", "4", "--expert-model-parallel-size", "2"});
  ASSERT_TRUE(off.status.ok()) << off.status.to_string();
  EXPECT_FALSE(off.registry->active("fix-router"));
  const Feature* f = off.registry->find("fix-router");
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->level(), 0);
  EXPECT_EQ(f->module(), FeatureModule::kKeyScenarios);
}

TEST(FixRouterFeature, RefusedWithoutExpertsOrExpertParallelism) {
  const std::vector<testing::FlagErrorCase> errors = {
      {{"--fix-router"}, 1, "--fix-router needs --num-experts (a MoE model), found no --num-experts"},
      {{"--num-experts", "4", "--fix-router"}, 1,
       "--fix-router: expected --expert-model-parallel-size greater than 1 (as MindSpeed), found 1"},
  };
  for (const testing::FlagErrorCase& e : errors) testing::expect_one_line_error(e);
}

}  // namespace
}  // namespace gale
