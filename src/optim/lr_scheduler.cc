// Learning-rate and weight-decay schedules (Megatron's OptimizerParamScheduler semantics).
#include "optim/lr_scheduler.h"

#include <cmath>

#include "core/check.h"

namespace gale {

double LrScheduler::lr(double max_lr, double min_lr) const {
  const double n = static_cast<double>(num_steps_);
  if (s_.warmup_steps > 0 && n <= s_.warmup_steps) return s_.init_lr + (max_lr - s_.init_lr) * n / s_.warmup_steps;
  if (s_.decay_style == "constant") return max_lr;
  if (num_steps_ > s_.decay_steps) return min_lr;
  if (s_.decay_style == "inverse-square-root") {
    double warmup = std::max(s_.warmup_steps, 1.0);
    double steps = static_cast<double>(std::max<int64_t>(num_steps_, 1));
    return std::max(min_lr, max_lr * std::sqrt(warmup) / std::sqrt(steps));
  }
  const double ratio = (n - s_.warmup_steps) / (static_cast<double>(s_.decay_steps) - s_.warmup_steps);
  GALE_CHECK(ratio >= 0.0 && ratio <= 1.0) << "decay ratio " << ratio;
  double coeff = 0.0;
  if (s_.decay_style == "linear") {
    coeff = 1.0 - ratio;
  } else if (s_.decay_style == "cosine") {
    coeff = 0.5 * (std::cos(M_PI * ratio) + 1.0);
  } else if (s_.decay_style == "WSD") {
    const int64_t anneal_start = s_.decay_steps - s_.wsd_decay_steps;
    if (num_steps_ <= anneal_start) {
      coeff = 1.0;
    } else {
      const double r = static_cast<double>(num_steps_ - anneal_start) / static_cast<double>(s_.wsd_decay_steps);
      if (s_.wsd_decay_style == "linear")
        coeff = 1.0 - r;
      else if (s_.wsd_decay_style == "cosine")
        coeff = 0.5 * (std::cos(M_PI * r) + 1.0);
      else if (s_.wsd_decay_style == "exponential")
        coeff = 2.0 * std::pow(0.5, r) - 1.0;
      else if (s_.wsd_decay_style == "minus_sqrt")
        coeff = 1.0 - std::sqrt(r);
      else
        GALE_CHECK(false) << "WSD decay style " << s_.wsd_decay_style;
    }
  } else {
    GALE_CHECK(false) << "decay style " << s_.decay_style;
  }
  return min_lr + coeff * (max_lr - min_lr);
}

double LrScheduler::weight_decay() const {
  if (num_steps_ > s_.wd_incr_steps) return s_.end_wd;
  if (s_.wd_incr_style == "constant") return s_.end_wd;
  const double ratio = static_cast<double>(num_steps_) / static_cast<double>(s_.wd_incr_steps);
  double coeff = 0.0;
  if (s_.wd_incr_style == "linear")
    coeff = ratio;
  else if (s_.wd_incr_style == "cosine")
    coeff = 0.5 * (std::cos(M_PI * (1.0 - ratio)) + 1.0);
  else
    GALE_CHECK(false) << "weight decay increment style " << s_.wd_incr_style;
  return s_.start_wd + coeff * (s_.end_wd - s_.start_wd);
}

}  // namespace gale
