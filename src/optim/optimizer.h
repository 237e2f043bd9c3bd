// The optimizer over a model chunk's flat parameter/gradient buffers: global-norm clipping,
// NaN/inf detection and the AdamW or SGD update with per-parameter weight decay.
//
// State (Adam moments, or SGD momentum) lives in flat buffers parallel to the parameters, with
// the same offsets, so checkpointing and sharding treat it like the parameters.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "kernels/op_table.h"
#include "model/params.h"

namespace gale {

struct OptimizerConfig {
  std::string type = "adam";  // "adam" (AdamW) or "sgd"
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double sgd_momentum = 0.9;
  double clip_grad = 1.0;  // 0 disables clipping
};

struct StepResult {
  bool applied = false;     // false when the gradients were not finite (the update was skipped)
  double grad_norm = 0.0;   // global L2 norm before clipping
  int64_t num_zeros = -1;   // zero gradients (only when asked)
};

class Optimizer {
 public:
  // `norm_group` is the group over which per-rank squared norms are summed (model-parallel
  // ranks; self with one process). counts_in_norm[i] says whether parameter i of `params` adds to
  // the norm on this rank (false for tensor-parallel duplicates and shared copies, so every
  // parameter counts exactly once); empty = all count.
  Optimizer(const OptimizerConfig& config, ParamBuffer* params, const OpTable* ops, Comm norm_group,
            std::vector<bool> counts_in_norm = {});

  // Global gradient norm (before clipping), over all ranks of the norm group.
  double grad_norm() const;
  // Clip, then update every parameter with learning rate `lr` and weight decay `wd` (0 for
  // parameters without decay). Skips the update when the gradient norm is not finite.
  StepResult step(double lr, double wd, bool count_zeros = false);

  int64_t steps_taken() const { return step_; }
  void set_steps_taken(int64_t s) { step_ = s; }
  const OptimizerConfig& config() const { return config_; }
  // Flat state buffers (same offsets as the parameters): "exp_avg", "exp_avg_sq" for Adam,
  // "momentum_buffer" for SGD.
  std::vector<std::pair<std::string, Tensor>> state() const;
  void set_ops(const OpTable* ops) { ops_ = ops; }

 private:
  OptimizerConfig config_;
  ParamBuffer* params_;
  const OpTable* ops_;
  Comm norm_group_;
  std::vector<bool> counts_in_norm_;
  Tensor exp_avg_, exp_avg_sq_, momentum_;
  int64_t step_ = 0;
};

}  // namespace gale
