// The --profile window and --record-memory-history around the training loop.
#include "train/profiler.h"

#include <algorithm>

#include "core/log.h"

namespace gale {

TraceOptions trace_options_from_args(const ProfileArgs& a) {
  TraceOptions o;
  const uint32_t step = static_cast<uint32_t>(TraceCategory::kStep), kernel = static_cast<uint32_t>(TraceCategory::kKernel),
                 comm = static_cast<uint32_t>(TraceCategory::kComm);
  o.categories = step;
  if (a.profile_level != "level_none") o.categories |= kernel;
  if (a.profile_level == "level1" || a.profile_level == "level2") o.categories |= comm;
  o.shapes = a.profile_record_shapes || a.profile_level == "level2";
  o.memory = a.profile_with_memory;
  return o;
}

std::string trace_path(const Arguments& args, int rank) {
  std::string dir = args.profile.profile_save_path;
  if (dir.empty()) dir = args.logging.tensorboard_dir;
  if (dir.empty()) dir = "profile_dir";
  return str_cat(dir, "/gale-trace-rank", rank, ".json");
}

bool profiles_rank(const ProfileArgs& a, int rank) {
  if (!a.profile) return false;
  return std::any_of(a.profile_ranks.begin(), a.profile_ranks.end(),
                     [rank](int64_t r) { return r == -1 || r == rank; });
}

Profiler::Profiler(const Arguments& args, int rank, int world_size)
    : flags_(args.profile), rank_(rank), start_(args.profile.profile_step_start), end_(args.profile.profile_step_end) {
  if (profiles_rank(flags_, rank)) {
    recorder_ = std::make_unique<TraceRecorder>(trace_options_from_args(flags_), rank);
    trace_path_ = trace_path(args, rank);
  }
  if (flags_.record_memory_history && rank == world_size - 1) history_ = std::make_unique<MemoryHistory>();
}

Profiler::~Profiler() {
  iteration_span_.reset();
  if (recorder_) recorder_->close_window();
  if (history_) history_->detach();
}

void Profiler::start_training() {
  if (history_) history_->attach();
}

void Profiler::before_step(int64_t completed) {
  if (history_) history_->set_iteration(completed + 1);
  if (!recorder_ || written_) return;
  // From the first step run at or after the start (a skipped iteration or a resumed run may pass it).
  if (!recorder_->window_open() && completed >= start_ && completed < end_) {
    recorder_->open_window();
    print_all(str_cat(" > --profile: rank ", rank_, " records iterations ", completed + 1, " to ", end_, " into ",
                      trace_path_));
  }
  if (recorder_->window_open()) iteration_span_.emplace(TraceCategory::kStep, "iteration",
                                                         std::initializer_list<TraceArg>{{"iteration", completed + 1}});
}

Status Profiler::after_step(int64_t completed) {
  iteration_span_.reset();
  if (!recorder_ || !recorder_->window_open() || completed < end_) return Status::Ok();
  GALE_RETURN_IF_ERROR(write_trace());
  if (history_) return write_snapshot(completed);
  return Status::Ok();
}

Status Profiler::at_log(int64_t completed) { return history_ ? write_snapshot(completed) : Status::Ok(); }

Status Profiler::finish(int64_t completed) {
  iteration_span_.reset();
  if (recorder_ && recorder_->window_open()) GALE_RETURN_IF_ERROR(write_trace());
  if (history_) {
    GALE_RETURN_IF_ERROR(write_snapshot(completed));
    history_->detach();
  }
  return Status::Ok();
}

Status Profiler::write_trace() {
  recorder_->close_window();
  written_ = true;
  Status st = recorder_->write(trace_path_);
  if (!st.ok()) return InvalidArgument("--profile: ", st.message());
  print_all(str_cat(" > --profile: rank ", rank_, " wrote ", recorder_->size(), " trace events to ", trace_path_));
  return Status::Ok();
}

Status Profiler::write_snapshot(int64_t completed) {
  return history_->write_snapshot(flags_.memory_snapshot_path, rank_, completed);
}

}  // namespace gale
