// Megatron's OptimizerParamScheduler: learning rate and weight decay as functions of the number
// of samples consumed (warmup, constant / linear / cosine / inverse-square-root / WSD decay).
//
// Steps are counted in SAMPLES: an iteration adds the global batch size. The rate used by the
// update of iteration k is lr() after k−1 calls of step(gbs); the logged rate is lr() after k.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

namespace gale {

struct LrSchedule {
  double max_lr = 0.0, min_lr = 0.0, init_lr = 0.0;  // init_lr = --lr-warmup-init
  double warmup_steps = 0.0;                          // samples (fractional with --lr-warmup-fraction)
  int64_t decay_steps = 0;                            // samples
  std::string decay_style = "linear";                 // constant, linear, cosine, inverse-square-root, WSD
  int64_t wsd_decay_steps = 0;                        // samples (WSD only)
  std::string wsd_decay_style = "exponential";        // exponential, linear, cosine, minus_sqrt
  double start_wd = 0.0, end_wd = 0.0;
  int64_t wd_incr_steps = 0;
  std::string wd_incr_style = "constant";             // constant, linear, cosine
};

class LrScheduler {
 public:
  explicit LrScheduler(const LrSchedule& schedule) : s_(schedule) {}

  double lr() const { return lr(s_.max_lr, s_.min_lr); }  // at the current num_steps
  // The same schedule between other bounds (Megatron's per-param-group max_lr / min_lr, e.g.
  // --decoupled-lr / --decoupled-min-lr): warmup from init_lr, then decay from max_lr to min_lr.
  double lr(double max_lr, double min_lr) const;
  double weight_decay() const;  // at the current num_steps
  void step(int64_t increment) { num_steps_ += increment; }
  int64_t num_steps() const { return num_steps_; }
  void set_num_steps(int64_t n) { num_steps_ = n; }
  const LrSchedule& schedule() const { return s_; }
  // A checkpoint's schedule (--use-checkpoint-opt_param-scheduler); num_steps is kept.
  void set_schedule(const LrSchedule& schedule) { s_ = schedule; }

 private:
  LrSchedule s_;
  int64_t num_steps_ = 0;
};

}  // namespace gale
