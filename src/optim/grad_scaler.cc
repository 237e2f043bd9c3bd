// Constant and dynamic loss scaling (the update rule is in the header).
#include "optim/grad_scaler.h"

#include <algorithm>

#include "core/check.h"

namespace gale {

GradScaler::GradScaler(const GradScalerConfig& config) : config_(config) {
  GALE_CHECK(config_.initial_scale > 0.0) << "loss scale " << config_.initial_scale;
  state_.scale = static_cast<float>(config_.initial_scale);
  state_.hysteresis_tracker = config_.hysteresis;
  if (!config_.dynamic) return;
  GALE_CHECK(config_.min_scale > 0.0 && config_.min_scale <= config_.initial_scale)
      << "min loss scale " << config_.min_scale << " with initial scale " << config_.initial_scale;
  GALE_CHECK(config_.growth_factor > 1.0) << "growth factor " << config_.growth_factor;
  GALE_CHECK(config_.backoff_factor > 0.0 && config_.backoff_factor < 1.0) << "backoff " << config_.backoff_factor;
  GALE_CHECK(config_.growth_interval > 0) << "growth interval " << config_.growth_interval;
  GALE_CHECK(config_.hysteresis > 0) << "hysteresis " << config_.hysteresis;
}

void GradScaler::update(bool found_inf) {
  if (!config_.dynamic) return;
  if (found_inf) {
    state_.growth_tracker = 0;
    state_.hysteresis_tracker -= 1;
    if (state_.hysteresis_tracker <= 0)
      state_.scale = std::max(state_.scale * static_cast<float>(config_.backoff_factor),
                              static_cast<float>(config_.min_scale));
    return;
  }
  state_.growth_tracker += 1;
  if (state_.growth_tracker == config_.growth_interval) {
    state_.growth_tracker = 0;
    state_.hysteresis_tracker = config_.hysteresis;
    state_.scale = state_.scale * static_cast<float>(config_.growth_factor);
  }
}

}  // namespace gale
