// The profile of one training run (--prof-file): its layout, step time, forward-backward and
// optimizer time, exact peak and persistent bytes per rank, parameters per rank and communication
// bytes per group; what --auto-settings fits its models to (train/auto_settings_model.h).
//
// The file is JSON, magic "gale-profile", version 1 (docs/formats/auto-settings.md). Times are
// those of the fastest iteration after the first (the first is warm-up: first touches, lazily
// allocated optimizer state; the fastest is the least disturbed by other processes), each the
// maximum over the ranks; bytes are the allocator's exact
// accounting (core/allocator.h): the peak since training started, and what stays allocated after
// it (parameters, gradients, optimizer state).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace gale {

class Timers;
class ParallelState;
struct Arguments;
struct Engine;

inline constexpr const char* kProfileMagic = "gale-profile";
inline constexpr int kProfileVersion = 1;

struct RunProfile {
  // The layout and the shape of the run.
  int64_t world_size = 1, tp = 1, cp = 1, pp = 1, dp = 1, vpp = 1;
  int64_t micro_batch_size = 1, global_batch_size = 1, num_micro_batches = 1;
  int64_t num_layers = 0, seq_length = 0, hidden_size = 0, num_threads = 0;
  bool sequence_parallel = false, distributed_optimizer = false;
  // Iterations the times are the fastest of (those after the first); 0 when the run had only one.
  int64_t measured_iterations = 0;
  double step_seconds = -1.0;
  double forward_backward_seconds = -1.0;  // -1: --timing-log-level 0 (no timers)
  double optimizer_seconds = -1.0;
  // Megatron's num_floating_point_operations of one iteration (the whole model, every rank;
  // training_log.h); 0 when unknown.
  double flops_per_iteration = 0.0;
  // Per rank, in world-rank order.
  std::vector<int64_t> peak_bytes, persistent_bytes, param_elems;
  // Bytes this rank passed to its tensor-, context-, data(-context)- and pipeline-parallel
  // groups per iteration (mean over the measured ones; communicator.h's counting), the maximum
  // over the ranks.
  int64_t tp_comm_bytes = 0, cp_comm_bytes = 0, dp_comm_bytes = 0, pp_comm_bytes = 0;

  int64_t max_peak_bytes() const;
  int64_t max_persistent_bytes() const;
  int64_t max_param_elems() const;
};

// Collects a run's profile: on_step after every iteration, finish() once after training (a
// collective over the world).
class ProfileRecorder {
 public:
  // `timers` may be null or below level 1 (no forward-backward / optimizer times).
  ProfileRecorder(Timers* timers, const ParallelState* ps, int64_t log_interval);
  void on_step(int64_t iteration, double seconds);
  // `flops_per_iteration`: Megatron's FLOPs of one iteration of the run (RunProfile's field).
  RunProfile finish(const Arguments& args, const Engine& engine, double flops_per_iteration);

 private:
  double timer_delta(int which);
  Timers* timers_;
  const ParallelState* ps_;
  int64_t log_interval_;
  int64_t steps_ = 0, measured_ = 0;
  double step_min_ = 0.0, fb_min_ = 0.0, opt_min_ = 0.0;
  double last_[2] = {0.0, 0.0};
  int64_t last_iteration_ = 0;
};

std::string profile_to_json(const RunProfile& p);
StatusOr<RunProfile> profile_from_json(const std::string& text);  // errors name what is wrong
Status write_profile(const RunProfile& p, const std::string& path);
StatusOr<RunProfile> read_profile(const std::string& path);

}  // namespace gale
