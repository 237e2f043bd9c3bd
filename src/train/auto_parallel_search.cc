// --auto-parallel's Thompson sampling over the layouts (see the header).
#include "train/auto_parallel_search.h"

#include <limits>
#include <random>

namespace gale {

AutoParallelResult thompson_search(const std::vector<AutoCandidate>& candidates, int max_trials, uint64_t seed,
                                   const AutoParallelRunner& run, double prior_rel_std, double noise_rel_std) {
  AutoParallelResult out;
  const size_t n = candidates.size();
  std::vector<double> mean(n), sd(n);
  std::vector<int> trial_of(n, -1);  // index into out.trials once run
  std::vector<bool> dropped(n, false);
  for (size_t i = 0; i < n; ++i) {
    mean[i] = candidates[i].prediction.step_seconds;
    sd[i] = prior_rel_std * mean[i];
  }
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> unit(0.0, 1.0);
  while (static_cast<int>(out.trials.size()) < max_trials) {
    size_t pick = n;
    double lowest = std::numeric_limits<double>::infinity();
    for (size_t i = 0; i < n; ++i) {
      const double draw = mean[i] + sd[i] * unit(rng);  // drawn for every candidate: the sequence stays fixed
      if (!dropped[i] && draw < lowest) lowest = draw, pick = i;
    }
    if (pick == n) break;  // every layout failed
    if (trial_of[pick] >= 0) {
      out.converged = true;
      break;
    }
    AutoParallelTrial t;
    t.layout = candidates[pick].layout;
    t.predicted_seconds = candidates[pick].prediction.step_seconds;
    StatusOr<double> measured = run(t.layout);
    if (measured.ok()) {
      t.measured_seconds = measured.value();
      mean[pick] = t.measured_seconds;
      sd[pick] = noise_rel_std * t.measured_seconds;
    } else {
      t.error = measured.status().message();
      dropped[pick] = true;
    }
    trial_of[pick] = static_cast<int>(out.trials.size());
    out.trials.push_back(t);
  }
  for (size_t k = 0; k < out.trials.size(); ++k)
    if (out.trials[k].measured_seconds >= 0 &&
        (out.best < 0 || out.trials[k].measured_seconds < out.trials[static_cast<size_t>(out.best)].measured_seconds))
      out.best = static_cast<int>(k);
  return out;
}

}  // namespace gale
