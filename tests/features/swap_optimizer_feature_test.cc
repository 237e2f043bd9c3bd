// MindSpeed's --swap-optimizer in the registry: implemented (no longer a planned flag), memory
// module, level 2; active with the distributed optimizer at level 2 only; each combination it
// cannot serve is a one-line error naming both flags.
#include <gtest/gtest.h>

#include "features/resolved_features.h"

namespace gale {
namespace {

TEST(SwapOptimizerFeature, ImplementedLevelTwoMemoryFeature) {
  ResolvedFeatures r({});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  const Feature* f = r.registry->find("swap-optimizer");
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->implemented());
  EXPECT_EQ(f->level(), 2);
  EXPECT_EQ(f->module(), FeatureModule::kMemory);
  EXPECT_EQ(f->flag(), "--swap-optimizer");
  EXPECT_EQ(f->counterpart(), "MindSpeed SwapOptimizerFeature (L2)");
  EXPECT_FALSE(r.registry->active("swap-optimizer"));  // not requested
}

TEST(SwapOptimizerFeature, ActiveWithTheDistributedOptimizerAtLevelTwoOnly) {
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{}, {"--swap-optimizer-times", "3", "--swap-optimizer-dir", "/var/tmp"},
        {"--swap-optimizer-times", "0"}, {"--optimizer", "sgd"}, {"--bf16"}}) {
    std::vector<std::string> argv = {"--use-distributed-optimizer", "--swap-optimizer"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    ResolvedFeatures on(argv);
    ASSERT_TRUE(on.status.ok()) << on.status.to_string();
    EXPECT_TRUE(on.registry->active("swap-optimizer"));
    EXPECT_TRUE(on.notices.empty());
  }
  ResolvedFeatures on({"--use-distributed-optimizer", "--swap-optimizer", "--swap-optimizer-times", "5"});
  EXPECT_EQ(on.args.training.swap_optimizer_times, 5);
  for (const char* level : {"0", "1"}) {
    ResolvedFeatures low({"--optimization-level", level, "--use-distributed-optimizer", "--swap-optimizer"});
    ASSERT_TRUE(low.status.ok()) << low.status.to_string();
    EXPECT_FALSE(low.registry->active("swap-optimizer"));
    ASSERT_EQ(low.notices.size(), 1u);
    EXPECT_NE(low.notices[0].find("--swap-optimizer is not active"), std::string::npos) << low.notices[0];
  }
}

TEST(SwapOptimizerFeature, RefusesWhatItCannotServe) {
  struct Case {
    std::vector<std::string> flags;
    std::string other;  // what the error names besides --swap-optimizer
  };
  const Case cases[] = {
      {{}, "--use-distributed-optimizer"},
      {{"--use-distributed-optimizer", "--bf16", "--reuse-fp32-param"}, "--reuse-fp32-param"},
      {{"--use-distributed-optimizer", "--optimizer", "muon"}, "--optimizer muon"},
      {{"--use-distributed-optimizer", "--swap-optimizer-times", "-1"}, "--swap-optimizer-times"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> argv = c.flags;
    argv.push_back("--swap-optimizer");
    ResolvedFeatures r(argv);
    ASSERT_FALSE(r.status.ok()) << c.other;
    const std::string m = r.status.message();
    EXPECT_NE(m.find("--swap-optimizer"), std::string::npos) << m;
    EXPECT_NE(m.find(c.other), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace gale
