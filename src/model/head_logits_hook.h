// An observer of the output layer's logits in training forwards that may reweight the LM loss's
// gradient and add a gradient of its own (Megatron main's offline distillation, train/logits_kd_hooks.h).
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "model/micro_batch.h"

namespace gale {

class HeadLogitsHook {
 public:
  virtual ~HeadLogitsHook() = default;
  // What a training forward's head does with its losses.
  struct Result {
    // The factor of the cross-entropy's gradient (0: the LM loss is not differentiated).
    double lm_coef = 1.0;
    // false: the micro-batch's LM loss is reported as 0 (Megatron's logits saver zeroes it).
    bool report_lm_loss = true;
    // Undefined or [T, V/TP]: a further gradient of the micro-batch's loss with respect to this rank's
    // logits, before the schedule's loss scale (the head multiplies it by loss scale and grad scale).
    Tensor logit_grad;
  };
  // Called by the last stage's head in every forward with a loss (training forwards, the forward-only
  // passes of --freeze-all-layers' training steps and evaluation alike: the hook tells them apart)
  // with the micro-batch, this rank's logits [T, V/TP] (row t = s·B + b, columns from vocab_offset,
  // --use-mup's output multiplier applied) and the loss mask in the same [S, B] order. lm_coef and
  // logit_grad count only in training forwards (those that keep state for backward);
  // report_lm_loss in every one.
  virtual Result training_logits(const MicroBatch& mb, const Tensor& logits, const std::vector<float>& mask_sb,
                                 int64_t vocab_offset) = 0;
  // Then, in the same forward, with the micro-batch's LM loss Σ mask·ℓ (whole vocabulary) and Σ mask.
  virtual void training_lm_loss(double loss_sum, double tokens) = 0;
  // The Trainer turns the hook on for its training steps (forward-only ones too) and off after them;
  // in other forwards (evaluation) it passes the LM loss through.
  void set_active(bool on) { active_ = on; }
  // The first error of a forward since the last call (a forward cannot return one), cleared.
  Status take_error() {
    Status e = error_;
    error_ = Status::Ok();
    return e;
  }

 protected:
  bool active() const { return active_; }
  bool has_error() const { return !error_.ok(); }
  // Keeps the first error.
  void record_error(Status e) {
    if (error_.ok()) error_ = std::move(e);
  }

 private:
  bool active_ = false;
  Status error_ = Status::Ok();
};

}  // namespace gale
