// Fault tolerance (--enable-ft-package): the per-rank hang monitor, Gale's native stand-in for
// nvidia-resiliency-ext's rank monitor (a side process started by ft_launcher there, a watchdog
// thread of the training process here). The training thread opens and closes named sections
// (setup, step, checkpointing); every check interval the watchdog compares how long each open
// section has been open with its timeout, or, with none open, how long the rank has been out of
// any section with the out-of-section timeout. A timeout that passes is reported once (by default:
// a message on stderr naming the rank, then the whole job ends with kFtHangExitCode).
// docs/fault-tolerance.md.
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "core/status.h"
#include "train/ft_timeouts.h"

namespace gale {

// The exit code of a job ended by a fault-tolerance timeout (sysexits' EX_TEMPFAIL: a transient
// failure; restarting the job from its last checkpoint is the expected reaction).
constexpr int kFtHangExitCode = 75;

// A timeout that passed.
struct FtTimeoutEvent {
  std::string section;  // the section, or "" for the out-of-section timeout
  double elapsed = 0;   // seconds the section has been open (or the rank out of any section)
  double timeout = 0;   // its timeout in seconds
};

// "FT: rank 1: section 'step' has been open for 2.31 s, more than its timeout of 1.00 s" (or
// "... has been out of any section for ..."), with what happens next.
std::string describe_ft_timeout(int rank, const FtTimeoutEvent& e);

class FtRankMonitor {
 public:
  using Clock = std::function<double()>;  // seconds, monotonic
  using TimeoutHandler = std::function<void(const FtTimeoutEvent&)>;

  // `clock` defaults to a monotonic clock. The out-of-section stretch starts now.
  FtRankMonitor(int rank, FtSectionTimeouts timeouts, double safety_factor, Clock clock = {});
  ~FtRankMonitor();  // stops the watchdog
  FtRankMonitor(const FtRankMonitor&) = delete;
  FtRankMonitor& operator=(const FtRankMonitor&) = delete;

  // FT's start_section / end_section / end_all_sections (the observed intervals feed calc()). An
  // error for a section not configured, one opened twice or closed while not open.
  Status start_section(const std::string& name);
  Status end_section(const std::string& name);
  void end_all_sections();

  // The first timeout that has passed at `now` (open sections in ft_section_names() order, then the
  // out-of-section one), or nullopt.
  std::optional<FtTimeoutEvent> check(double now) const;

  // Starts the watchdog thread: every `interval_seconds` it calls check(clock()) and, the first time
  // a timeout has passed, `on_timeout` (default: the message on stderr, then the job ends with
  // kFtHangExitCode on every rank). Called at most once.
  void start_watchdog(double interval_seconds, TimeoutHandler on_timeout = {});
  void stop_watchdog();

  // Whether the out-of-section timeout is checked (default: yes). --ft-num-warmup-iters turns it off
  // until its warm-up iterations have ended; turning it on restarts the out-of-section stretch at now
  // when no section is open, so the warm-up never counts against it.
  void set_out_of_section_monitored(bool on);

  FtSectionTimeouts timeouts() const;
  void set_timeouts(const FtSectionTimeouts& t);  // in force at once (FT's _set_calculated_timeouts)
  // The observed intervals (FT's TimeoutsCalc). Used by the training thread only.
  FtTimeoutsCalc& calc() { return calc_; }
  double now() const { return clock_(); }
  int rank() const { return rank_; }

 private:
  void watch(double interval_seconds, TimeoutHandler on_timeout);

  const int rank_;
  Clock clock_;
  mutable std::mutex mu_;  // guards everything below (the training thread and the watchdog)
  FtSectionTimeouts timeouts_;
  std::map<std::string, double> open_;  // section -> when it opened
  double out_of_section_since_;
  bool out_of_section_monitored_ = true;
  FtTimeoutsCalc calc_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
  std::thread watchdog_;
};

}  // namespace gale
