// MindSpeed's --swap-attention in the registry: implemented (no longer a planned flag), memory
// module, level 2; --swap-modules as one comma-separated string or several values; each
// combination it cannot serve is a one-line error naming both flags.
#include <gtest/gtest.h>

#include "features/resolved_features.h"
#include "train/model_setup.h"

namespace gale {
namespace {

TEST(SwapAttentionFeature, ImplementedLevelTwoMemoryFeature) {
  ResolvedFeatures r({});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  const Feature* f = r.registry->find("swap-attention");
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->implemented());
  EXPECT_EQ(f->level(), 2);
  EXPECT_EQ(f->module(), FeatureModule::kMemory);
  EXPECT_EQ(f->counterpart(), "MindSpeed SwapAttentionFeature (L2)");
  EXPECT_FALSE(r.registry->active("swap-attention"));
  ResolvedFeatures on({"--swap-attention"});
  ASSERT_TRUE(on.status.ok()) << on.status.to_string();
  EXPECT_TRUE(on.registry->active("swap-attention"));
  ResolvedFeatures low({"--optimization-level", "1", "--swap-attention"});
  ASSERT_TRUE(low.status.ok()) << low.status.to_string();
  EXPECT_FALSE(low.registry->active("swap-attention"));
}

TEST(SwapAttentionFeature, SwapModulesAsMindSpeedsStringOrAList) {
  ResolvedFeatures defaults({"--swap-attention"});
  SwapAttentionConfig c = swap_attention_config_from_args(defaults.args);
  EXPECT_TRUE(c.enabled && c.input_norm && c.self_attention && c.post_attention_norm);
  ResolvedFeatures one({"--swap-attention", "--swap-modules", "self_attention,input_norm"});
  ASSERT_TRUE(one.status.ok()) << one.status.to_string();
  c = swap_attention_config_from_args(one.args);
  EXPECT_TRUE(c.input_norm && c.self_attention && !c.post_attention_norm);
  ResolvedFeatures list({"--swap-attention", "--swap-modules", "post_attention_norm", "input_norm"});
  ASSERT_TRUE(list.status.ok()) << list.status.to_string();
  c = swap_attention_config_from_args(list.args);
  EXPECT_TRUE(c.input_norm && !c.self_attention && c.post_attention_norm);
}

TEST(SwapAttentionFeature, RefusesWhatItCannotServe) {
  struct Case {
    std::vector<std::string> flags;
    std::string other;
  };
  const Case cases[] = {
      {{"--swap-modules", "mlp"}, "'mlp'"},
      {{"--lora-target-modules", "linear_qkv"}, "--lora-target-modules"},
      {{"--schedules-method", "dualpipev", "--pipeline-model-parallel-size", "2"}, "dualpipev"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> argv = c.flags;
    argv.push_back("--swap-attention");
    ResolvedFeatures r(argv);
    ASSERT_FALSE(r.status.ok()) << c.other;
    const std::string m = r.status.message();
    EXPECT_TRUE(m.find("--swap-attention") != std::string::npos || m.find("--swap-modules") != std::string::npos) << m;
    EXPECT_NE(m.find(c.other), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace gale
