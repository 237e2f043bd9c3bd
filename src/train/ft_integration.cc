// Megatron's fault-tolerance integration over Gale's rank monitor.
#include "train/ft_integration.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "core/check.h"
#include "core/log.h"
#include "train/arguments.h"

namespace gale {

StatusOr<std::unique_ptr<FtIntegration>> FtIntegration::setup(const FtArgs& args, const std::string& save_dir,
                                                               bool async_save, Comm world,
                                                               FtRankMonitor::Clock clock) {
  print_rank0("FT: initializing...");
  if (save_dir.empty())
    return InvalidArgument("--enable-ft-package needs --save (the fault-tolerance state is kept in <save>/ft_state.json)");
  if (world->rank() == 0) {  // the state can be written before the first checkpoint
    std::error_code ec;
    std::filesystem::create_directories(save_dir, ec);
    if (ec) return IOError("--save ", save_dir, ": cannot create the directory (", ec.message(), ")");
  }
  FtSectionTimeouts timeouts;
  GALE_RETURN_IF_ERROR(
      parse_ft_section_timeouts(args.rank_section_timeouts, "--ft-param-rank_section_timeouts", &timeouts.section));
  GALE_RETURN_IF_ERROR(parse_ft_timeout(args.rank_out_of_section_timeout, "--ft-param-rank_out_of_section_timeout",
                                        &timeouts.out_of_section));
  const std::string path = ft_state_path(save_dir);
  GALE_ASSIGN_OR_RETURN(std::optional<FtSectionTimeouts> loaded, read_ft_state(path));
  auto monitor = std::make_unique<FtRankMonitor>(world->rank(), loaded ? *loaded : timeouts, args.safety_factor,
                                                 std::move(clock));
  std::unique_ptr<FtIntegration> ft(
      new FtIntegration(std::move(monitor), world, path, args.calc_ft_timeouts, async_save, args.num_warmup_iters));
  if (loaded) print_rank0(str_cat("FT: loaded timeouts from ", path, ". ", describe_ft_timeouts(*loaded)));
  print_rank0(str_cat("FT: initialized. Timeouts: ", describe_ft_timeouts(ft->monitor_->timeouts()),
                      "; check interval ", args.workload_check_interval, " s"));
  GALE_RETURN_IF_ERROR(ft->monitor_->start_section("setup"));
  ft->setup_open_ = true;
  if (const char* stall = std::getenv(kFtTestStallEnv)) {
    if (std::sscanf(stall, "%d:%ld", &ft->stall_rank_, &ft->stall_iteration_) != 2)
      return InvalidArgument(kFtTestStallEnv, ": expected <rank>:<iteration>, found '", stall, "'");
  }
  ft->monitor_->start_watchdog(args.workload_check_interval);
  return ft;
}

FtIntegration::FtIntegration(std::unique_ptr<FtRankMonitor> monitor, Comm world, std::string state_path, bool calc,
                             bool async_save, int64_t num_warmup_iters)
    : monitor_(std::move(monitor)), world_(std::move(world)), state_path_(std::move(state_path)), calc_(calc),
      async_save_(async_save), num_warmup_iters_(num_warmup_iters) {
  // The warm-up iterations are excluded from the out-of-section monitoring too.
  monitor_->set_out_of_section_monitored(num_warmup_iters_ <= 0);
}

FtIntegration::~FtIntegration() { monitor_->stop_watchdog(); }

void FtIntegration::on_training_step_start(int64_t iteration) {
  if (world_->rank() == stall_rank_ && iteration == stall_iteration_) {
    std::fprintf(stderr, "FT test: rank %d stalls before iteration %ld (%s)\n", stall_rank_,
                 static_cast<long>(iteration), kFtTestStallEnv);
    std::fflush(stderr);
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  if (setup_open_) {
    GALE_CHECK_OK(monitor_->end_section("setup"));
    setup_open_ = false;
  }
  if (seen_train_iters_ >= num_warmup_iters_) GALE_CHECK_OK(monitor_->start_section("step"));
  eval_iter_idx_ = 0;  // training started again: the next evaluation warms up again
}

void FtIntegration::on_training_step_end() {
  if (seen_train_iters_ >= num_warmup_iters_) GALE_CHECK_OK(monitor_->end_section("step"));
  ++seen_train_iters_;
  if (seen_train_iters_ == num_warmup_iters_) monitor_->set_out_of_section_monitored(true);
}

void FtIntegration::on_eval_step_start() {
  if (setup_open_) {  // evaluation before any training iteration
    GALE_CHECK_OK(monitor_->end_section("setup"));
    setup_open_ = false;
  }
  if (eval_iter_idx_ >= num_warmup_iters_) GALE_CHECK_OK(monitor_->start_section("step"));
}

void FtIntegration::on_eval_step_end() {
  if (eval_iter_idx_ >= num_warmup_iters_) GALE_CHECK_OK(monitor_->end_section("step"));
  ++eval_iter_idx_;
}

void FtIntegration::on_checkpointing_start() { GALE_CHECK_OK(monitor_->start_section("checkpointing")); }

Status FtIntegration::on_checkpointing_end(bool is_async_finalization) {
  GALE_CHECK_OK(monitor_->end_section("checkpointing"));
  // A finalisation runs before every iteration and is mostly a no-op: only saves count.
  if (is_async_finalization) return Status::Ok();
  ++seen_checkpoints_;
  return maybe_update_timeouts(/*closing=*/false);
}

void FtIntegration::on_checkpoint_loaded(bool is_local_checkpoint) { persistent_loaded_ = !is_local_checkpoint; }

Status FtIntegration::shutdown() {
  if (shut_down_) return Status::Ok();
  shut_down_ = true;
  print_rank0("FT: closing...");
  Status st = maybe_update_timeouts(/*closing=*/true);
  monitor_->stop_watchdog();
  print_rank0("FT: closed.");
  return st;
}

// Megatron's _maybe_update_timeouts. Every rank takes the same decisions (the counters agree), so
// the all-reduce below is entered by all or none.
Status FtIntegration::maybe_update_timeouts(bool closing) {
  if (!calc_) return Status::Ok();
  std::vector<std::string> sections;
  if (persistent_loaded_)
    sections.push_back("setup");
  else
    print_rank0("FT: can't update the setup section timeout until persistent checkpoint is loaded");
  if (seen_train_iters_ >= kMinItersForStepTimeoutUpdate)
    sections.push_back("step");
  else
    print_rank0("FT: need to see more training iterations to update the step section timeout");
  if (seen_checkpoints_ > 0) {
    if (!async_save_)
      sections.push_back("checkpointing");
    else  // asynchronous saves make the section's length vary too much between runs
      print_rank0("FT: can't update the checkpointing section timeout with async checkpointing");
  } else {
    print_rank0("FT: checkpointing section is not updated until a checkpoint was saved");
  }
  bool out_of_section = false;
  if (closing) {
    const bool setup_and_step = persistent_loaded_ && seen_train_iters_ >= kMinItersForStepTimeoutUpdate;
    out_of_section = setup_and_step && seen_checkpoints_ > 0;
    if (!out_of_section)
      print_rank0("FT: the out-of-section timeout won't be updated until all FT sections were seen");
  } else {
    print_rank0("FT: the out-of-section timeout won't be updated as the FT is not closing yet");
  }
  if (sections.empty() && !out_of_section) return Status::Ok();
  std::string names;
  for (const std::string& s : sections) names += (names.empty() ? "" : ", ") + s;
  print_rank0(str_cat("FT: updating timeouts for: [", names, "] update out-of-section: ",
                      out_of_section ? "True" : "False", " ..."));
  // FT's calculate_and_set_section_timeouts: the current out-of-section stretch counts, then the
  // longest intervals of any rank.
  FtTimeoutsCalc& calc = monitor_->calc();
  calc.bump_out_of_section(monitor_->now());
  std::vector<double> maxima = calc.maxima();
  world_->all_reduce(maxima.data(), static_cast<int64_t>(maxima.size()), DType::kF64, ReduceOp::kMax);
  calc.set_maxima(maxima);
  StatusOr<FtSectionTimeouts> updated = calc.calculate(sections, out_of_section, monitor_->timeouts());
  if (!updated.ok()) {  // an interval never observed on any rank (e.g. a step-less run)
    print_rank0(str_cat("FT: timeouts not updated: ", updated.status().message()));
    return Status::Ok();
  }
  monitor_->set_timeouts(updated.value());
  if (world_->rank() == 0) {
    GALE_RETURN_IF_ERROR(write_ft_state(state_path_, updated.value()));
    print_rank0(str_cat("FT: updated timeouts saved to ", state_path_, ". ", describe_ft_timeouts(updated.value())));
  }
  return Status::Ok();
}

}  // namespace gale
