// Loss scaling for --fp16 (Megatron's grad scalers): the loss gradient is multiplied by the scale
// before backward, the gradients by its inverse before the optimizer, and an iteration whose
// gradients are not finite skips its update and (dynamic scaling) shrinks the scale.
//
// Why: under --fp16 every GEMM input, the backward's gradients included, is rounded to f16
// (model/linear.h), whose smallest subnormal is 2^-24 and largest value 65504. Scaling the loss
// keeps small gradients from flushing to zero; a scale too large makes them overflow to infinity,
// which poisons the f32 gradients and is seen as a non-finite gradient norm.
//
// Dynamic scaling (--fp16 without --loss-scale), as Megatron's DynamicGradScaler:
//   found_inf:  growth_tracker = 0; hysteresis_tracker −= 1;
//               if hysteresis_tracker <= 0: scale = max(scale · backoff_factor, min_scale)
//   otherwise:  growth_tracker += 1; when it reaches growth_interval (--loss-scale-window):
//               growth_tracker = 0, hysteresis_tracker = hysteresis, scale ·= growth_factor.
// So with the default --hysteresis 2 the first overflow keeps the scale, and every further one
// before the next growth halves it. The scale is an f32 value, as Megatron's tensor; starting
// from a power of two (--initial-loss-scale 2^32) it stays one, so scaling and unscaling are exact.
// Constant scaling (--loss-scale S) never changes S and update() does nothing.
#pragma once

#include <cstdint>

namespace gale {

struct GradScalerConfig {
  bool dynamic = true;
  double initial_scale = 4294967296.0;  // --initial-loss-scale (2^32), or --loss-scale when constant
  double min_scale = 1.0;               // --min-loss-scale
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 1000;  // --loss-scale-window
  int64_t hysteresis = 2;          // --hysteresis
};

// What a checkpoint keeps (Megatron's grad_scaler state dict).
struct GradScalerState {
  float scale = 1.0f;
  int64_t growth_tracker = 0;
  int64_t hysteresis_tracker = 0;
};

class GradScaler {
 public:
  explicit GradScaler(const GradScalerConfig& config);

  float scale() const { return state_.scale; }
  // 1 / scale, computed in double and rounded to f32 (Megatron's inv_scale).
  float inv_scale() const { return static_cast<float>(1.0 / static_cast<double>(state_.scale)); }
  bool dynamic() const { return config_.dynamic; }
  // After each iteration's gradient check: `found_inf` when the gradients were not finite.
  void update(bool found_inf);

  const GradScalerState& state() const { return state_; }
  void set_state(const GradScalerState& s) { state_ = s; }

 private:
  GradScalerConfig config_;
  GradScalerState state_;
};

}  // namespace gale
