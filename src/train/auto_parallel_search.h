// --auto-parallel's search (MindSpeed's automatic parallelism): Thompson sampling over the layouts
// that fit in memory, with the fitted step-time model (train/auto_settings_model.h) as the prior
// and real runs of the sampled layouts as the observations.
//
// Each candidate's step time is a normal belief: before it ran, mean = the model's prediction and
// standard deviation = prior_rel_std × it (the model's uncertainty); after it ran, mean = the
// measured time and deviation = noise_rel_std × it. Each round draws one time per candidate (a
// seeded generator: the same inputs give the same trials) and takes the smallest draw: a layout
// not yet run is run (a failed run drops it), and the search stops when the draw picks one that
// already ran (the measured best is then the likeliest fastest) or after max_trials runs. The
// answer is the fastest measured layout.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/status.h"
#include "train/auto_settings_search.h"

namespace gale {

struct AutoParallelTrial {
  AutoLayout layout;
  double predicted_seconds = 0;
  double measured_seconds = -1;  // -1: the run failed
  std::string error;             // why it failed
};

struct AutoParallelResult {
  std::vector<AutoParallelTrial> trials;  // in run order
  int best = -1;                          // index into trials of the fastest measured one; -1: none ran
  bool converged = false;                 // stopped because the draw picked a layout that ran
};

// Runs `layout` for real: its step seconds, or an error (the layout is dropped).
using AutoParallelRunner = std::function<StatusOr<double>(const AutoLayout& layout)>;

AutoParallelResult thompson_search(const std::vector<AutoCandidate>& candidates, int max_trials, uint64_t seed,
                                   const AutoParallelRunner& run, double prior_rel_std = 0.3,
                                   double noise_rel_std = 0.05);

}  // namespace gale
