// MindSpeed's --smart-swap in the registry: implemented (no longer a planned flag), memory module,
// level 2, off below --optimization-level 2; its sizes in MiB become whole bytes; each combination
// it does not serve is a one-line error naming the flag, what it expected and what it found.
#include <gtest/gtest.h>

#include "features/resolved_features.h"
#include "train/model_setup.h"

namespace gale {
namespace {

TEST(SmartSwapFeature, ImplementedLevelTwoMemoryFeature) {
  ResolvedFeatures r({});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  const Feature* f = r.registry->find("smart-swap");
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->implemented());
  EXPECT_EQ(f->level(), 2);
  EXPECT_EQ(f->module(), FeatureModule::kMemory);
  EXPECT_EQ(f->counterpart(), "MindSpeed SmartSwapFeature (L2)");
  EXPECT_FALSE(r.registry->active("smart-swap"));
  ResolvedFeatures on({"--smart-swap"});
  ASSERT_TRUE(on.status.ok()) << on.status.to_string();
  EXPECT_TRUE(on.registry->active("smart-swap"));
  ResolvedFeatures low({"--optimization-level", "1", "--smart-swap"});
  ASSERT_TRUE(low.status.ok()) << low.status.to_string();
  EXPECT_FALSE(low.registry->active("smart-swap"));
}

TEST(SmartSwapFeature, DefaultsAreMindSpeedsAndSizesAreWholeBytes) {
  ResolvedFeatures d({"--smart-swap"});
  SmartSwapConfig c = smart_swap_config_from_args(d.args);
  EXPECT_TRUE(c.enabled);
  EXPECT_EQ(c.warmup_iters, 2);                     // MindSpeed's warmup_step
  EXPECT_EQ(c.reduction_bytes, int64_t{3} << 30);   // MindSpeed's reduction_memory
  EXPECT_EQ(c.target_bytes, 0);
  ResolvedFeatures t({"--smart-swap", "--smart-swap-target-mb", "0.5", "--smart-swap-warmup-iters", "3",
                      "--swap-attention-dir", "/var/tmp"});
  ASSERT_TRUE(t.status.ok()) << t.status.to_string();
  c = smart_swap_config_from_args(t.args);
  EXPECT_EQ(c.target_bytes, 524288);
  EXPECT_EQ(c.warmup_iters, 3);
  EXPECT_EQ(c.dir, "/var/tmp");
}

TEST(SmartSwapFeature, RefusesWhatItDoesNotServe) {
  struct Case {
    std::vector<std::string> flags;
    std::string expected, found;
  };
  const Case cases[] = {
      {{"--swap-attention"}, "no --swap-attention", "found it set"},
      {{"--swap-layer-input"}, "no --swap-layer-input", "found it set"},
      {{"--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"},
       "no full recomputation", "--recompute-granularity full"},
      {{"--pipeline-model-parallel-size", "2"}, "--pipeline-model-parallel-size 1", "--pipeline-model-parallel-size 2"},
      {{"--compress-activation", "0"}, "no --compress-activation", "--compress-activation 0"},
      {{"--compress-dense", "level0"}, "no --compress-dense", "--compress-dense level0"},
      {{"--lora-target-modules", "linear_qkv"}, "no LoRA", "--lora-target-modules"},
      {{"--rampup-batch-size", "2", "2", "100"}, "a constant global batch size", "--rampup-batch-size"},
      {{"--smart-swap-warmup-iters", "0"}, "at least 1", "found 0"},
      {{"--smart-swap-reduction-mb", "-1"}, ">= 0", "found -1"},
      {{"--smart-swap-reduction-mb", "1", "--smart-swap-target-mb", "2"}, "one of --smart-swap-reduction-mb",
       "found both"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> argv = c.flags;
    argv.push_back("--smart-swap");
    ResolvedFeatures r(argv);
    ASSERT_FALSE(r.status.ok()) << c.found;
    const std::string m = r.status.message();
    EXPECT_NE(m.find("--smart-swap"), std::string::npos) << m;
    EXPECT_NE(m.find(c.expected), std::string::npos) << m;
    EXPECT_NE(m.find(c.found), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace gale
