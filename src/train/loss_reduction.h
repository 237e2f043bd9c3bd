// The reduction of a training iteration's logged lm loss across ranks: blocking (Megatron), or
// non-blocking with --async-log-allreduce (MindSpeed's AsyncLogAllreduceFeature).
#pragma once

#include <array>
#include <memory>

#include "comm/communicator.h"

namespace gale {

// Sums {loss sum, tokens} over the data-parallel group, then gives every pipeline stage the loss
// stage's sums (the last, or rank 0 under DualPipeV: `root`, -1 = the last) (the other stages hold none; they need the loss for the NaN decision and the log).
//
//   LossReduction r = LossReduction::start(dp, loss_sum, tokens, async);
//   ... optimizer step ...
//   r.finish(pp);                  // waits (async), then broadcasts over pp
//   r.loss_sum(), r.tokens()
//
// Blocking, start() runs the all-reduce itself. With `async`, start() only issues it (the
// communicator's all_reduce_async: the same reduction, so the same sums) and finish() waits for
// it: work between the two overlaps the communication. The sums are readable after finish() only.
// `dp` or `pp` may be null or of size 1: no communication on that group.
class LossReduction {
 public:
  static LossReduction start(Communicator* dp, double loss_sum, double tokens, bool async);
  LossReduction() = default;
  LossReduction(LossReduction&&) = default;
  LossReduction& operator=(LossReduction&&) = default;
  // An all-reduce still in flight (an error between start and finish) is waited for: its buffer
  // must outlive it.
  ~LossReduction();

  void finish(Communicator* pp, int root = -1);
  double loss_sum() const;
  double tokens() const;

 private:
  // Heap-held: the buffer of an all-reduce in flight must not move with the object.
  std::unique_ptr<std::array<double, 2>> sums_;
  WorkPtr work_;  // the all-reduce in flight (async), else null
  bool finished_ = false;
};

}  // namespace gale
