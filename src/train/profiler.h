// --profile and --record-memory-history for the training loop: when the trace window opens and
// closes, which ranks record, where the files go (README "Profiling"; docs/formats/trace.md and
// docs/formats/memory-snapshot.md).
//
// The window is Megatron's: with --profile-step-start S and --profile-step-end E, the trace covers
// the training steps run while the completed-iteration count is S .. E−1, i.e. the log line's
// iterations S+1 .. E (MindSpeed's torch_npu schedule skips S steps and records E − S: the same
// steps). It opens before step S+1 (or the first step run after it: --iterations-to-skip, a run
// resumed past S) and closes, and its file is written, after step E; a run that ends inside the
// window writes what it recorded at its end; a window the run never reaches writes nothing. Ranks: --profile-ranks (default [0], Megatron's; -1 every rank, MindSpeed's).
// File: <dir>/gale-trace-rank<R>.json with dir = --profile-save-path, else --tensorboard-dir
// (where Megatron's --use-pytorch-profiler writes), else ./profile_dir (MindSpeed's default).
//
// --profile-level (MindSpeed's; default level0) picks the trace's categories (core/trace.h):
//   level_none  step phases only (iteration, forward-compute / backward-compute per micro-batch and
//               chunk, the pipeline's sends and receives, gradient reductions, optimizer phases);
//   level0      + every op-table kernel call, GEMMs included;
//   level1      + every collective and point-to-point call (bytes, group) and the time waited on it;
//   level2      + every kernel call's sizes and FLOPs (as --profile-record-shapes).
//
// --record-memory-history: the last rank (Megatron's) attaches a MemoryHistory to the host
// allocator when training starts and writes its snapshot to --memory-snapshot-path at every log
// line (as Megatron), at the end of a --profile window it records, and when training ends.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "core/memory_history.h"
#include "core/status.h"
#include "core/trace.h"
#include "train/arguments.h"

namespace gale {

// The trace categories and options of the profiling flags (level and the with-/record- switches).
TraceOptions trace_options_from_args(const ProfileArgs& a);
// The trace file of `rank` for these flags (see above).
std::string trace_path(const Arguments& args, int rank);
// Whether `rank` records a trace (--profile and --profile-ranks).
bool profiles_rank(const ProfileArgs& a, int rank);

class Profiler {
 public:
  Profiler(const Arguments& args, int rank, int world_size);
  ~Profiler();

  // Whether this rank records a trace; the op table must then be traced (kernels/op_trace.h).
  bool traces() const { return recorder_ != nullptr; }
  const std::string& trace_file() const { return trace_path_; }
  // Attaches the memory history (last rank, --record-memory-history); call when training starts.
  void start_training();
  // Around each training step; `completed` is the iteration count before / after it.
  void before_step(int64_t completed);
  Status after_step(int64_t completed);
  // At each log line: the memory snapshot.
  Status at_log(int64_t completed);
  // At the end of training: a window still open is closed and written; the last snapshot.
  Status finish(int64_t completed);

 private:
  Status write_trace();
  Status write_snapshot(int64_t completed);
  const ProfileArgs& flags_;
  int rank_;
  int64_t start_, end_;
  std::string trace_path_;
  std::unique_ptr<TraceRecorder> recorder_;
  std::optional<TraceScope> iteration_span_;
  bool written_ = false;
  std::unique_ptr<MemoryHistory> history_;
};

}  // namespace gale
