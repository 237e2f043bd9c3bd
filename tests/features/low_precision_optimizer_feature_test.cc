// MindSpeed's low-precision optimizer in the registry: implemented, memory module, level 0 (active
// whenever --quant-states fp8|mxfp8|hif8 or --quant-grads is given, at any --optimization-level); each
// combination it cannot serve is a one-line error naming both flags (and "not supported yet" where
// MindSpeed has it and Gale does not yet).
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

TEST(LowPrecisionOptimizerFeature, QuantGradsActiveAloneAndWithStates) {
  for (const std::vector<std::string>& argv :
       {std::vector<std::string>{"--quant-grads"}, {"--quant-grads", "--quant-states", "fp8"},
        {"--quant-grads", "--use-distributed-optimizer"}, {"--quant-grads", "--bf16", "--optimization-level", "0"},
        {"--quant-grads", "--fp16"}}) {
    ResolvedFeatures r(argv);
    ASSERT_TRUE(r.status.ok()) << r.status.to_string();
    EXPECT_TRUE(r.registry->active("low-precision-optimizer"));
    EXPECT_TRUE(r.args.training.quant_grads);
  }
}

TEST(LowPrecisionOptimizerFeature, RefusesWhatItCannotServe) {
  struct Case {
    std::vector<std::string> flags;
    std::vector<std::string> expected;  // what the one-line error names
  };
  const Case cases[] = {
      {{"--quant-grads", "--optimizer", "sgd"}, {"--quant-grads", "--optimizer adam", "--optimizer sgd"}},
      {{"--quant-grads", "--optimizer", "muon"}, {"--quant-grads", "--optimizer muon"}},
      {{"--quant-grads", "--use-distributed-optimizer", "--swap-optimizer"}, {"--quant-grads", "--swap-optimizer"}},
      {{"--quant-grads", "--overlap-grad-reduce"}, {"--quant-grads", "--overlap-grad-reduce", "not supported yet"}},
      {{"--quant-grads", "--use-custom-fsdp", "--data-parallel-sharding-strategy", "optim_grads"},
       {"--quant-grads", "optim_grads", "not supported yet"}},
      {{"--quant-grads", "--layerzero"}, {"--quant-grads", "--layerzero", "not supported yet"}},
      {{"--quant-grads", "--num-experts", "4", "--expert-model-parallel-size", "2"},
       {"--quant-grads", "--expert-model-parallel-size 2", "not supported yet"}},
      {{"--quant-grads", "--use-distributed-optimizer", "--num-distributed-optimizer-instances", "2"},
       {"--quant-grads", "--num-distributed-optimizer-instances 2", "not supported yet"}},
      {{"--quant-grads", "--pipeline-model-parallel-size", "2", "--num-layers", "4", "--schedules-method", "dualpipev",
        "--dualpipev-dw-detach"},
       {"--quant-grads", "--dualpipev-dw-detach", "not supported yet"}},
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
