// MindSpeed's --compress-optimizer, --compress-activation and --compress-dense in the registry:
// implemented (no longer planned flags), memory module, level 2, active at level 2 only; their
// values parsed (layer lists, levels) and each conflict a one-line error naming both flags.
#include <gtest/gtest.h>

#include "features/resolved_features.h"

namespace gale {
namespace {

TEST(CompressFeatures, ImplementedLevelTwoMemoryFeatures) {
  ResolvedFeatures r({});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  for (const auto& [name, counterpart] :
       {std::pair<std::string, std::string>{"compress-optimizer", "MindSpeed CompressOptimizerFeature (L2)"},
        {"compress-activation", "MindSpeed CompressActivationFeature (L2)"},
        {"compress-dense", "MindSpeed AnsCompressTensorFeature (L2)"}}) {
    const Feature* f = r.registry->find(name);
    ASSERT_NE(f, nullptr) << name;
    EXPECT_TRUE(f->implemented()) << name;
    EXPECT_EQ(f->level(), 2);
    EXPECT_EQ(f->module(), FeatureModule::kMemory);
    EXPECT_EQ(f->flag(), "--" + name);
    EXPECT_EQ(f->counterpart(), counterpart);
    EXPECT_FALSE(r.registry->active(name));  // not requested
  }
}

TEST(CompressFeatures, ActiveAtLevelTwoOnly) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"compress-optimizer", {"--compress-optimizer"}},
      {"compress-optimizer", {"--compress-optimizer", "--use-distributed-optimizer"}},
      {"compress-optimizer", {"--compress-optimizer", "--optimizer", "sgd"}},
      {"compress-activation", {"--num-layers", "4", "--compress-activation", "0"}},
      {"compress-activation", {"--num-layers", "8", "--compress-activation", "1-3,5,7-8"}},
      {"compress-dense", {"--compress-dense", "level0"}},
      {"compress-dense", {"--compress-dense", "level1"}},
  };
  for (const auto& [name, flags] : cases) {
    ResolvedFeatures on(flags);
    ASSERT_TRUE(on.status.ok()) << on.status.to_string();
    EXPECT_TRUE(on.registry->active(name)) << name;
    EXPECT_TRUE(on.notices.empty());
    std::vector<std::string> low_flags = {"--optimization-level", "1"};
    low_flags.insert(low_flags.end(), flags.begin(), flags.end());
    ResolvedFeatures low(low_flags);
    ASSERT_TRUE(low.status.ok()) << low.status.to_string();
    EXPECT_FALSE(low.registry->active(name)) << name;
    ASSERT_EQ(low.notices.size(), 1u);
    EXPECT_NE(low.notices[0].find("--" + name + " is not active"), std::string::npos) << low.notices[0];
  }
  ResolvedFeatures off({"--compress-dense", "disable"});
  ASSERT_TRUE(off.status.ok());
  EXPECT_FALSE(off.registry->active("compress-dense"));
}

TEST(CompressFeatures, RefusesWhatTheyCannotServe) {
  struct Case {
    std::vector<std::string> flags;
    std::string flag, other;  // the feature's flag and what the error names besides it
  };
  const Case cases[] = {
      {{"--compress-optimizer", "--optimizer-selection", "fused_ema_adamw"}, "--compress-optimizer",
       "--optimizer-selection fused_ema_adamw"},
      {{"--compress-optimizer", "--use-distributed-optimizer", "--swap-optimizer"}, "--compress-optimizer",
       "--swap-optimizer"},
      {{"--compress-optimizer", "--quant-states", "fp8"}, "--compress-optimizer", "--quant-states"},
      {{"--compress-optimizer", "--optimizer", "muon"}, "--compress-optimizer", "--optimizer muon"},
      {{"--compress-optimizer", "--bf16", "--reuse-fp32-param"}, "--compress-optimizer", "--reuse-fp32-param"},
      {{"--compress-optimizer", "--num-experts", "4", "--expert-model-parallel-size", "2", "--moe-token-dispatcher-type",
        "alltoall", "--enable-expert-placement"},
       "--enable-expert-placement with --compress-optimizer", "not supported yet"},
      {{"--num-layers", "4", "--compress-activation", "0", "--recompute-activation-function"}, "--compress-activation",
       "--recompute-activation-function"},
      {{"--num-layers", "4", "--compress-activation", "1", "--compress-dense", "level0"}, "--compress-activation",
       "--compress-dense level0"},
      {{"--compress-dense", "level1", "--recompute-activation-function"}, "--compress-dense level1",
       "--recompute-activation-function"},
      {{"--num-layers", "4", "--compress-activation", "5"}, "--compress-activation", "layer 5 in '5' is outside 1..4"},
      {{"--num-layers", "4", "--compress-activation", "1-x"}, "--compress-activation", "found '1-x'"},
      {{"--num-layers", "4", "--compress-activation", "3-2"}, "--compress-activation", "'3-2' ends before it starts"},
      {{"--num-layers", "4", "--compress-activation", "1,,2"}, "--compress-activation", "found ''"},
  };
  for (const Case& c : cases) {
    ResolvedFeatures r(c.flags);
    ASSERT_FALSE(r.status.ok()) << c.other;
    const std::string m = r.status.message();
    EXPECT_NE(m.find(c.flag), std::string::npos) << m;
    EXPECT_NE(m.find(c.other), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
  ResolvedFeatures bad_level({"--compress-dense", "level2"});
  ASSERT_FALSE(bad_level.status.ok());
  EXPECT_NE(bad_level.status.message().find("--compress-dense"), std::string::npos) << bad_level.status.message();
}

}  // namespace
}  // namespace gale
