// Loss scaling (optim/grad_scaler.h) against Megatron's DynamicGradScaler rule, step by step.
#include "optim/grad_scaler.h"

#include <gtest/gtest.h>

namespace gale {
namespace {

TEST(GradScaler, DynamicScaleFollowsHysteresisBackoffAndGrowth) {
  GradScalerConfig c;
  c.initial_scale = 1024.0;
  c.min_scale = 128.0;
  c.growth_interval = 3;
  c.hysteresis = 2;
  GradScaler s(c);
  EXPECT_EQ(s.scale(), 1024.0f);
  EXPECT_EQ(s.inv_scale(), 1.0f / 1024.0f);
  s.update(true);  // first overflow: hysteresis 2 -> 1, scale kept
  EXPECT_EQ(s.scale(), 1024.0f);
  s.update(true);  // second in a row: halves
  EXPECT_EQ(s.scale(), 512.0f);
  s.update(false);  // a clean iteration does not restore the hysteresis
  s.update(true);   // tracker already <= 0: halves at once
  EXPECT_EQ(s.scale(), 256.0f);
  s.update(true);
  s.update(true);  // bounded below by min_scale
  EXPECT_EQ(s.scale(), 128.0f);
  EXPECT_EQ(s.state().growth_tracker, 0);
  for (int i = 0; i < 2; ++i) s.update(false);
  EXPECT_EQ(s.scale(), 128.0f);
  s.update(false);  // the third clean iteration in a row doubles and restores the hysteresis
  EXPECT_EQ(s.scale(), 256.0f);
  EXPECT_EQ(s.state().hysteresis_tracker, 2);
  EXPECT_EQ(s.state().growth_tracker, 0);
  s.update(true);  // hysteresis again: kept
  EXPECT_EQ(s.scale(), 256.0f);
  EXPECT_EQ(s.state().growth_tracker, 0);
}

TEST(GradScaler, MegatronDefaultsStartAtTwoToThe32) {
  GradScaler s{GradScalerConfig{}};
  EXPECT_EQ(s.scale(), 4294967296.0f);
  EXPECT_TRUE(s.dynamic());
  // 31 overflows in a row: the first keeps the scale, each further one halves it, down to 2^2.
  for (int i = 0; i < 31; ++i) s.update(true);
  EXPECT_EQ(s.scale(), 4.0f);
}

TEST(GradScaler, ConstantScaleNeverChanges) {
  GradScalerConfig c;
  c.dynamic = false;
  c.initial_scale = 4096.0;
  GradScaler s(c);
  for (int i = 0; i < 5; ++i) s.update(true);
  for (int i = 0; i < 2000; ++i) s.update(false);
  EXPECT_EQ(s.scale(), 4096.0f);
}

TEST(GradScaler, StateRoundTrips) {
  GradScaler a{GradScalerConfig{}};
  a.update(true);
  a.update(true);
  a.update(false);
  GradScaler b{GradScalerConfig{}};
  b.set_state(a.state());
  a.update(true);
  b.update(true);
  EXPECT_EQ(a.scale(), b.scale());
  EXPECT_EQ(a.state().hysteresis_tracker, b.state().hysteresis_tracker);
  EXPECT_EQ(a.state().growth_tracker, b.state().growth_tracker);
}

}  // namespace
}  // namespace gale
