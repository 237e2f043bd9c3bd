// Megatron's fault-tolerance integration (--enable-ft-package; megatron/training/ft_integration.py,
// core_v0.12.1) over Gale's native rank monitor (train/ft_rank_monitor.h):
// - "setup" is open from start-up (after the arguments are checked) until the first training or
//   evaluation iteration;
// - "step" wraps each training iteration after the first --ft-num-warmup-iters N of the process (the
//   warm-up iterations fall out of section), and each evaluation iteration after the first N of an
//   evaluation run (the count starts again at every training iteration); Megatron-LM main's flag
//   (default 5; core_v0.12.1 had N = 1 fixed);
// - the out-of-section timeout applies only once N training iterations have ended (the warm-up is
//   excluded from monitoring, as FT's init_workload_monitoring(num_warmup_iters));
// - "checkpointing" wraps every save (persistent or not) and every finalisation of an --async-save
//   (the non-blocking one at the top of every iteration included, as Megatron);
// - everything else is out of section.
// With --calc-ft-timeouts the timeouts are recalculated after each save and at the end of the run
// from the longest intervals observed on any rank (× --ft-param-safety_factor, merged with earlier
// calculated values), logged, and written by rank 0 to <save>/ft_state.json, which the next run
// with the same --save loads at start-up. docs/fault-tolerance.md.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "core/status.h"
#include "train/ft_rank_monitor.h"

namespace gale {

struct FtArgs;

// The test-only environment variable GALE_FT_TEST_STALL="<rank>:<iteration>": that rank stops
// (sleeps forever) just before training iteration <iteration> (1-based) opens its section, so the
// other ranks wait for it inside a collective of that iteration. Not a user feature.
inline constexpr const char* kFtTestStallEnv = "GALE_FT_TEST_STALL";

class FtIntegration {
 public:
  // Megatron's ft_integration.setup: creates --save if needed, loads <save>/ft_state.json when
  // present (its timeouts replace the flags'), logs the timeouts, opens "setup" and starts the
  // watchdog. `world` is used for the calculation's all-reduce; `clock` (seconds) is for tests.
  static StatusOr<std::unique_ptr<FtIntegration>> setup(const FtArgs& args, const std::string& save_dir,
                                                        bool async_save, Comm world,
                                                        FtRankMonitor::Clock clock = {});
  ~FtIntegration();

  // `iteration`: the 1-based number of the training iteration about to run.
  void on_training_step_start(int64_t iteration);
  void on_training_step_end();
  void on_eval_step_start();
  void on_eval_step_end();
  void on_checkpointing_start();
  // After a save (is_async_finalization false: counts as a checkpoint, and with --calc-ft-timeouts
  // recalculates the timeouts: a collective) or an async-save finalisation.
  Status on_checkpointing_end(bool is_async_finalization);
  // After --load restored a checkpoint (a local non-persistent one does not tell the setup time).
  void on_checkpoint_loaded(bool is_local_checkpoint);
  // Megatron's shutdown: the last recalculation (a collective; the out-of-section timeout is
  // recalculated only here, once setup, step and a save were seen), then the watchdog stops.
  Status shutdown();

  FtRankMonitor& monitor() { return *monitor_; }
  int64_t seen_training_iterations() const { return seen_train_iters_; }

  // Warm-up iterations outside "step" (--ft-num-warmup-iters).
  int64_t num_warmup_iters() const { return num_warmup_iters_; }
  // Megatron's constant: training iterations needed before the step timeout is recalculated.
  static constexpr int64_t kMinItersForStepTimeoutUpdate = 16;

 private:
  FtIntegration(std::unique_ptr<FtRankMonitor> monitor, Comm world, std::string state_path, bool calc, bool async_save,
                int64_t num_warmup_iters);
  Status maybe_update_timeouts(bool closing);

  std::unique_ptr<FtRankMonitor> monitor_;
  Comm world_;
  std::string state_path_;
  bool calc_ = false, async_save_ = false;
  bool setup_open_ = false, persistent_loaded_ = false, shut_down_ = false;
  int64_t num_warmup_iters_ = 1;
  int64_t seen_checkpoints_ = 0, seen_train_iters_ = 0, eval_iter_idx_ = 0;
  int stall_rank_ = -1;
  int64_t stall_iteration_ = -1;
};

}  // namespace gale
