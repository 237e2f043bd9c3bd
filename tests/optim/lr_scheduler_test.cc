// Megatron's OptimizerParamScheduler semantics: warmup, decay styles, WSD, weight-decay increments.
#include "optim/lr_scheduler.h"

#include <gtest/gtest.h>

#include <cmath>

namespace gale {
namespace {

LrSchedule base() {
  LrSchedule s;
  s.max_lr = 1e-3;
  s.min_lr = 1e-4;
  s.warmup_steps = 20;  // samples
  s.decay_steps = 100;
  s.start_wd = s.end_wd = 0.1;
  s.wd_incr_steps = 100;
  return s;
}

TEST(LrScheduler, LinearWarmupFromInitThenLinearDecay) {
  LrSchedule s = base();
  s.init_lr = 1e-5;
  LrScheduler sch(s);
  EXPECT_DOUBLE_EQ(sch.lr(), 1e-5);  // step 0 uses the warmup init
  sch.step(4);
  EXPECT_DOUBLE_EQ(sch.lr(), 1e-5 + (1e-3 - 1e-5) * 4.0 / 20.0);
  sch.set_num_steps(20);
  EXPECT_DOUBLE_EQ(sch.lr(), 1e-3);  // end of warmup (n <= warmup is still warmup)
  sch.set_num_steps(60);
  EXPECT_DOUBLE_EQ(sch.lr(), 1e-4 + 0.5 * (1e-3 - 1e-4));
  sch.set_num_steps(100);
  EXPECT_DOUBLE_EQ(sch.lr(), 1e-4);
  sch.set_num_steps(101);
  EXPECT_DOUBLE_EQ(sch.lr(), 1e-4);
}

TEST(LrScheduler, Cosine) {
  LrSchedule s = base();
  s.decay_style = "cosine";
  LrScheduler sch(s);
  sch.set_num_steps(40);  // ratio 0.25
  EXPECT_NEAR(sch.lr(), 1e-4 + 0.5 * (std::cos(M_PI * 0.25) + 1.0) * 9e-4, 1e-15);
}

// --decoupled-lr: the same warmup and decay between other bounds (Megatron's per-group max/min).
TEST(LrScheduler, OtherBoundsFollowTheSameSchedule) {
  LrSchedule s = base();
  s.decay_style = "cosine";
  LrScheduler sch(s);
  sch.set_num_steps(10);  // warmup: from init_lr 0 towards the group's max
  EXPECT_DOUBLE_EQ(sch.lr(5e-3, 5e-4), 5e-3 * 10 / 20);
  sch.set_num_steps(40);
  EXPECT_NEAR(sch.lr(5e-3, 5e-4), 5e-4 + 0.5 * (std::cos(M_PI * 0.25) + 1.0) * 4.5e-3, 1e-15);
  EXPECT_EQ(sch.lr(s.max_lr, s.min_lr), sch.lr());
  sch.set_num_steps(101);
  EXPECT_DOUBLE_EQ(sch.lr(5e-3, 5e-4), 5e-4);
}

TEST(LrScheduler, ConstantAndInverseSquareRoot) {
  LrSchedule s = base();
  s.decay_style = "constant";
  LrScheduler c(s);
  c.set_num_steps(1000);
  EXPECT_DOUBLE_EQ(c.lr(), 1e-3);
  s.decay_style = "inverse-square-root";
  LrScheduler r(s);
  r.set_num_steps(80);
  EXPECT_DOUBLE_EQ(r.lr(), 1e-3 * std::sqrt(20.0) / std::sqrt(80.0));
  s.min_lr = 6e-4;
  LrScheduler r2(s);
  r2.set_num_steps(80);
  EXPECT_DOUBLE_EQ(r2.lr(), 6e-4);
}

TEST(LrScheduler, WsdAnnealsInTheLastStepsOnly) {
  LrSchedule s = base();
  s.decay_style = "WSD";
  s.wsd_decay_steps = 40;
  for (const char* style : {"exponential", "linear", "cosine", "minus_sqrt"}) {
    s.wsd_decay_style = style;
    LrScheduler sch(s);
    sch.set_num_steps(60);
    EXPECT_DOUBLE_EQ(sch.lr(), 1e-3) << style;  // stable phase
    sch.set_num_steps(80);                      // half-way through annealing
    double r = 0.5, coeff = 0.0;
    if (std::string(style) == "exponential") coeff = 2.0 * std::pow(0.5, r) - 1.0;
    if (std::string(style) == "linear") coeff = 1.0 - r;
    if (std::string(style) == "cosine") coeff = 0.5 * (std::cos(M_PI * r) + 1.0);
    if (std::string(style) == "minus_sqrt") coeff = 1.0 - std::sqrt(r);
    EXPECT_NEAR(sch.lr(), 1e-4 + coeff * 9e-4, 1e-15) << style;
  }
}

TEST(LrScheduler, FractionalWarmup) {
  LrSchedule s = base();
  s.warmup_steps = 2.5;  // e.g. --lr-warmup-fraction 0.025 of 100 samples
  LrScheduler sch(s);
  sch.set_num_steps(2);
  EXPECT_DOUBLE_EQ(sch.lr(), 1e-3 * 2.0 / 2.5);
  sch.set_num_steps(3);
  EXPECT_DOUBLE_EQ(sch.lr(), 1e-4 + (1.0 - (3.0 - 2.5) / 97.5) * 9e-4);
}

TEST(LrScheduler, WeightDecayIncrement) {
  LrSchedule s = base();
  s.start_wd = 0.0;
  s.end_wd = 0.1;
  s.wd_incr_style = "linear";
  LrScheduler sch(s);
  sch.set_num_steps(25);
  EXPECT_DOUBLE_EQ(sch.weight_decay(), 0.025);
  s.wd_incr_style = "cosine";
  LrScheduler c(s);
  c.set_num_steps(50);
  EXPECT_NEAR(c.weight_decay(), 0.05, 1e-15);
  c.set_num_steps(150);
  EXPECT_DOUBLE_EQ(c.weight_decay(), 0.1);
}

}  // namespace
}  // namespace gale
