// MindSpeed's --swap-layer-input in the registry: implemented memory feature of level 2 (off below
// it), and the swap config it gives alone (only the layer input) and with --swap-attention (both).
#include <gtest/gtest.h>

#include "features/resolved_features.h"
#include "train/model_setup.h"

namespace gale {
namespace {

TEST(SwapLayerInputFeature, ImplementedLevelTwoMemoryFeature) {
  ResolvedFeatures r({});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  const Feature* f = r.registry->find("swap-layer-input");
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->implemented());
  EXPECT_EQ(f->level(), 2);
  EXPECT_EQ(f->module(), FeatureModule::kMemory);
  EXPECT_EQ(f->counterpart(), "MindSpeed SwapLayerInputFeature (L2)");
  EXPECT_FALSE(r.registry->active("swap-layer-input"));
  EXPECT_FALSE(swap_attention_config_from_args(r.args).enabled);
  ResolvedFeatures on({"--swap-layer-input"});
  ASSERT_TRUE(on.status.ok()) << on.status.to_string();
  EXPECT_TRUE(on.registry->active("swap-layer-input"));
  ResolvedFeatures low({"--optimization-level", "1", "--swap-layer-input"});
  ASSERT_TRUE(low.status.ok()) << low.status.to_string();
  EXPECT_FALSE(low.registry->active("swap-layer-input"));
}

TEST(SwapLayerInputFeature, ConfigAloneAndWithSwapAttention) {
  ResolvedFeatures alone({"--swap-layer-input", "--swap-attention-dir", "/somewhere"});
  SwapAttentionConfig c = swap_attention_config_from_args(alone.args);
  EXPECT_TRUE(c.enabled && c.layer_input);
  EXPECT_FALSE(c.input_norm || c.self_attention || c.post_attention_norm);
  EXPECT_EQ(c.dir, "/somewhere");
  ResolvedFeatures both({"--swap-layer-input", "--swap-attention", "--swap-modules", "self_attention"});
  ASSERT_TRUE(both.status.ok()) << both.status.to_string();
  c = swap_attention_config_from_args(both.args);
  EXPECT_TRUE(c.enabled && c.layer_input && c.self_attention);
  EXPECT_FALSE(c.input_norm || c.post_attention_norm);
  ResolvedFeatures attention_only({"--swap-attention"});
  c = swap_attention_config_from_args(attention_only.args);
  EXPECT_TRUE(c.enabled && c.input_norm && !c.layer_input);
}

}  // namespace
}  // namespace gale
