// The optimizer over the flat parameter/gradient buffers of this rank's model chunks: global-norm
// clipping, NaN/inf detection and the AdamW or SGD update with per-parameter weight decay.
//
// State (Adam moments, or SGD momentum) lives in flat buffers parallel to each chunk's
// parameters, with the same offsets, so checkpointing and sharding treat it like the parameters.
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

// The parameters one optimizer updates: a chunk's buffer and which of its parameters count
// towards the global gradient norm on this rank (false for tensor-parallel replicas on TP ranks
// other than 0 and for duplicated tied weights, so that every parameter counts exactly once).
struct OptimizedBuffer {
  ParamBuffer* params = nullptr;
  std::vector<bool> counts_in_norm;  // empty = all count
};

class Optimizer {
 public:
  // `norm_group` sums the per-rank squared norms (Megatron's model-parallel group; self with one
  // process).
  Optimizer(const OptimizerConfig& config, std::vector<OptimizedBuffer> buffers, const OpTable* ops, Comm norm_group);
  // One buffer, every parameter counting.
  Optimizer(const OptimizerConfig& config, ParamBuffer* params, const OpTable* ops, Comm norm_group);

  // Global gradient norm (before clipping), over all ranks of the norm group.
  double grad_norm() const;
  // Global L2 norm of the parameters, counted the same way (--log-params-norm).
  double params_norm() const;
  // Clip, then update every parameter with learning rate `lr` and weight decay `wd` (0 for
  // parameters without decay). Skips the update when the gradient norm is not finite.
  StepResult step(double lr, double wd, bool count_zeros = false);

  int64_t steps_taken() const { return step_; }
  void set_steps_taken(int64_t s) { step_ = s; }
  const OptimizerConfig& config() const { return config_; }
  size_t num_buffers() const { return buffers_.size(); }
  // Flat state buffers of buffer `b` (same offsets as its parameters): "exp_avg", "exp_avg_sq" for
  // Adam, "momentum_buffer" for SGD.
  std::vector<std::pair<std::string, Tensor>> state(size_t b = 0) const;
  void set_ops(const OpTable* ops) { ops_ = ops; }

 private:
  struct BufferState {
    OptimizedBuffer buffer;
    Tensor exp_avg, exp_avg_sq, momentum;
  };
  double norm_of(bool grads) const;

  OptimizerConfig config_;
  std::vector<BufferState> buffers_;
  const OpTable* ops_;
  Comm norm_group_;
  int64_t step_ = 0;
};

}  // namespace gale
