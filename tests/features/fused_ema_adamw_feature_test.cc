// MindSpeed's --optimizer-selection fused_ema_adamw in the registry: implemented, level 0 (active at
// every level, on the reference kernel at level 0 and the vectorised one from level 1), the flags
// reach the optimizer's configuration, and each combination it cannot serve is a one-line error
// naming the flags, what was expected and what was found.
#include <gtest/gtest.h>

#include "features/resolved_features.h"
#include "kernels/cpu/fused_ops.h"
#include "train/model_setup.h"

namespace gale {
namespace {

TEST(FusedEmaAdamwFeature, ImplementedLevelZeroFeature) {
  ResolvedFeatures r({});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  const Feature* f = r.registry->find("fused-ema-adamw");
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->implemented());
  EXPECT_EQ(f->level(), 0);
  EXPECT_EQ(f->flag(), "--optimizer-selection");
  EXPECT_EQ(f->counterpart(), "MindSpeed FusedEmaAdamwFeature (L0)");
  EXPECT_FALSE(r.registry->active("fused-ema-adamw"));  // fused_adamw by default
  EXPECT_FALSE(optimizer_config_from_args(r.args).ema);
}

TEST(FusedEmaAdamwFeature, ActiveAtEveryLevelWithItsKernel) {
  for (const char* level : {"0", "1", "2"}) {
    ResolvedFeatures r({"--optimization-level", level, "--optimizer-selection", "fused_ema_adamw", "--ema-decay", "0.999"});
    ASSERT_TRUE(r.status.ok()) << r.status.to_string();
    EXPECT_TRUE(r.registry->active("fused-ema-adamw")) << level;
    const OptimizerConfig c = optimizer_config_from_args(r.args);
    EXPECT_TRUE(c.ema);
    EXPECT_EQ(c.ema_decay, 0.999);
    if (std::string(level) == "0") {
      EXPECT_EQ(r.ops.ema_adamw_step, &ema_adamw_step_ref);
    } else {
      EXPECT_EQ(r.ops.ema_adamw_step, fused_kernel_set(min_isa(Isa::kAvx512, detected_isa()))->ema_adamw_step);
      EXPECT_NE(r.ops.ema_adamw_step, &ema_adamw_step_ref);
    }
  }
  for (const char* same : {"fused_adamw", "fused_torch_adamw"}) {
    ResolvedFeatures r({"--optimizer-selection", same});
    ASSERT_TRUE(r.status.ok()) << r.status.to_string();
    EXPECT_FALSE(r.registry->active("fused-ema-adamw"));
    EXPECT_FALSE(optimizer_config_from_args(r.args).ema);
  }
}

TEST(FusedEmaAdamwFeature, RefusesWhatItCannotServe) {
  struct Case {
    std::vector<std::string> flags;
    std::string message;
  };
  const Case cases[] = {
      {{"--ema-decay", "1.5"}, "--ema-decay: expected a value in [0, 1] (as MindSpeed), found 1.5"},
      {{"--ema-decay", "-0.1"}, "--ema-decay: expected a value in [0, 1] (as MindSpeed), found -0.1"},
      {{"--optimizer", "muon"},
       "--optimizer-selection fused_ema_adamw: expected --optimizer adam (AdamW), found --optimizer muon"},
      {{"--optimizer", "sgd"},
       "--optimizer-selection fused_ema_adamw: expected --optimizer adam (AdamW), found --optimizer sgd"},
      {{"--use-distributed-optimizer", "--swap-optimizer"},
       "--optimizer-selection fused_ema_adamw: conflicts with --swap-optimizer (as MindSpeed)"},
      {{"--bf16", "--reuse-fp32-param"},
       "--optimizer-selection fused_ema_adamw: conflicts with --reuse-fp32-param (as MindSpeed)"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> argv = c.flags;
    argv.insert(argv.end(), {"--optimizer-selection", "fused_ema_adamw"});
    ResolvedFeatures r(argv);
    EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument) << c.message;
    EXPECT_EQ(r.status.message(), c.message);
  }
  // Without fused_ema_adamw the same flags are fine.
  ResolvedFeatures plain({"--use-distributed-optimizer", "--swap-optimizer"});
  EXPECT_TRUE(plain.status.ok()) << plain.status.to_string();
}

}  // namespace
}  // namespace gale
