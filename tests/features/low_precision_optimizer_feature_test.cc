// MindSpeed's low-precision optimizer in the registry: implemented, memory module, level 0 (active
// whenever --quant-states fp8|mxfp8|hif8 is given, at any --optimization-level); --quant-grads refused
// as not supported yet; each combination it cannot serve is a one-line error naming both flags.
#include <gtest/gtest.h>

#include "features/resolved_features.h"

namespace gale {
namespace {

TEST(LowPrecisionOptimizerFeature, ImplementedLevelZeroMemoryFeature) {
  ResolvedFeatures r({});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  const Feature* f = r.registry->find("low-precision-optimizer");
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->implemented());
  EXPECT_EQ(f->level(), 0);
  EXPECT_EQ(f->module(), FeatureModule::kMemory);
  EXPECT_EQ(f->flag(), "--quant-states");
  EXPECT_EQ(f->counterpart(), "MindSpeed LowPrecisionOptimizerFeature (L0)");
  EXPECT_FALSE(r.registry->active("low-precision-optimizer"));  // not requested
}

TEST(LowPrecisionOptimizerFeature, ActiveAtEveryLevelWhenRequested) {
  for (const char* mode : {"fp8", "mxfp8", "hif8"})
    for (const char* level : {"0", "1", "2"})
      for (const std::vector<std::string>& extra :
           {std::vector<std::string>{}, {"--use-distributed-optimizer"}, {"--bf16", "--reuse-fp32-param"}}) {
        std::vector<std::string> argv = {"--optimization-level", level, "--quant-states", mode};
        argv.insert(argv.end(), extra.begin(), extra.end());
        ResolvedFeatures r(argv);
        ASSERT_TRUE(r.status.ok()) << r.status.to_string();
        EXPECT_TRUE(r.registry->active("low-precision-optimizer")) << mode << " level " << level;
        EXPECT_EQ(r.args.training.quant_states, mode);
      }
}

TEST(LowPrecisionOptimizerFeature, RefusesWhatItCannotServe) {
  struct Case {
    std::vector<std::string> flags;
    std::vector<std::string> expected;  // what the one-line error names
  };
  const Case cases[] = {
      {{"--quant-grads"}, {"--quant-grads", "not supported yet", "f32"}},
      {{"--quant-states", "fp8", "--quant-grads"}, {"--quant-grads", "not supported yet"}},
      {{"--quant-states", "fp8", "--optimizer", "sgd"}, {"--quant-states fp8", "--optimizer adam", "--optimizer sgd"}},
      {{"--quant-states", "mxfp8", "--optimizer", "muon"}, {"--quant-states mxfp8", "--optimizer muon"}},
      {{"--quant-states", "hif8", "--optimizer", "sgd"}, {"--quant-states hif8", "--optimizer adam", "--optimizer sgd"}},
      {{"--quant-states", "hif8", "--use-distributed-optimizer", "--swap-optimizer"},
       {"--quant-states hif8", "--swap-optimizer"}},
      {{"--quant-states", "fp8", "--use-distributed-optimizer", "--swap-optimizer"},
       {"--quant-states fp8", "--swap-optimizer"}},
      {{"--quant-states", "fp8", "--use-custom-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params"},
       {"--quant-states", "optim_grads_params", "not supported yet"}},
      {{"--quant-states", "fp8", "--optimizer-selection", "fused_ema_adamw"},
       {"--quant-states fp8", "--optimizer-selection fused_ema_adamw", "not supported yet"}},
  };
  for (const Case& c : cases) {
    ResolvedFeatures r(c.flags);
    ASSERT_FALSE(r.status.ok()) << c.expected[0];
    const std::string m = r.status.message();
    for (const std::string& e : c.expected) EXPECT_NE(m.find(e), std::string::npos) << m << " lacks " << e;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace gale
