// Megatron's --log-progress: the job's progress appended to <--save>/progress.txt.
//
// Rank 0 appends one tab-separated line per event (after a barrier of all ranks, as Megatron's
// append_to_progress_log); nothing is written without --save. The events are Megatron's: the
// start of every job, and every checkpoint save:
//
//   2026-12-01 10:00:00<TAB>Job ID: <SLURM_JOB_ID><TAB># GPUs: 4<TAB>Starting job
//   2026-12-01 10:05:00<TAB>Job ID: <TAB># GPUs: 4<TAB>Saved checkpoint<TAB>Iteration: 100<TAB>
//     Job throughput: 0.1 TFLOP/s/GPU<TAB>Cumulative throughput: 0.1 TFLOP/s/GPU<TAB>
//     Floating-point operations: 1.23e+15<TAB>Tokens (in billions): 0.01
//
// ("Saving async checkpoint" with --async-save; "# GPUs" is the number of processes). The job
// throughput divides the floating-point operations of this job (since its checkpoint was loaded)
// by the time since the job started; the cumulative throughput divides those since the first job of
// the current world size by the time since that job's "Starting job" line (read back from the
// file); both per process and in TFLOP/s. The floating-point operations are the model's, as the
// log line's throughput counts them, cumulative over all jobs (saved in the checkpoint); the
// tokens are the consumed training samples times --seq-length.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "comm/communicator.h"
#include "core/status.h"

namespace gale {

// One progress.txt line without its newline: "<time>\tJob ID: <job id>\t# GPUs: <world>\t<text>".
std::string progress_line(const std::string& time, const std::string& job_id, int64_t world_size,
                          const std::string& text);

// The text of a save's line: "Saved checkpoint\tIteration: ...\tTokens (in billions): ...".
std::string saved_checkpoint_text(bool async_save, int64_t iteration, double job_throughput,
                                  double cumulative_throughput, double floating_point_operations, int64_t tokens);

// Megatron's get_start_time_from_progress_log over the file's contents: the time of the first
// "Starting job" line since the last line of another world size, and the floating-point operations
// of the last "Saved checkpoint" line before it (0 when none). nullopt when there is no such line.
struct ProgressStart {
  std::string time;  // "2026-12-01 10:00:00", local time
  double floating_point_operations = 0.0;
};
std::optional<ProgressStart> progress_start(const std::string& contents, int64_t world_size);

class ProgressLog {
 public:
  // `save_dir`: --save (empty: nothing is written). `job_start_seconds`: when the job started, in
  // seconds since the epoch (Megatron's _TRAIN_START_TIME: the earliest over the ranks).
  ProgressLog(std::string save_dir, Comm world, double job_start_seconds);

  // A collective: a barrier, then rank 0 appends a line with `text`.
  Status append(const std::string& text);
  Status start_job() { return append("Starting job"); }
  // A collective, after a checkpoint save at `iteration`: the throughputs and the cumulative
  // floating-point operations and tokens. `job_start_floating_point_operations`: the count when this
  // job started (loaded from its checkpoint, or 0).
  Status saved_checkpoint(int64_t iteration, double floating_point_operations_so_far,
                          double job_start_floating_point_operations, int64_t tokens_so_far, bool async_save);

  // progress.txt's path ("" without --save).
  std::string path() const;

 private:
  Status write(const std::string& text);  // rank 0: appends the line


  std::string save_dir_;
  Comm world_;
  double job_start_seconds_;
};

// Seconds since the epoch, wall-clock.
double wall_seconds();

}  // namespace gale
