// The per-rank fault-tolerance hang monitor: section bookkeeping and its watchdog thread.
#include "train/ft_rank_monitor.h"

#include <chrono>
#include <cstdio>

#include "core/check.h"

namespace gale {

namespace {

double monotonic_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

std::string describe_ft_timeout(int rank, const FtTimeoutEvent& e) {
  char what[256];
  if (e.section.empty())
    std::snprintf(what, sizeof what,
                  "has been out of any section for %.2f s, more than the out-of-section timeout of %.2f s "
                  "(--ft-param-rank_out_of_section_timeout)",
                  e.elapsed, e.timeout);
  else
    std::snprintf(what, sizeof what,
                  "section '%s' has been open for %.2f s, more than its timeout of %.2f s "
                  "(--ft-param-rank_section_timeouts)",
                  e.section.c_str(), e.elapsed, e.timeout);
  return str_cat("FT: rank ", rank, ": ", what, "; the rank is considered hung: ending the job with exit code ",
                 kFtHangExitCode);
}

FtRankMonitor::FtRankMonitor(int rank, FtSectionTimeouts timeouts, double safety_factor, Clock clock)
    : rank_(rank),
      clock_(clock ? std::move(clock) : Clock(monotonic_seconds)),
      timeouts_(std::move(timeouts)),
      out_of_section_since_(clock_()),
      calc_(out_of_section_since_, safety_factor) {}

FtRankMonitor::~FtRankMonitor() { stop_watchdog(); }

Status FtRankMonitor::start_section(const std::string& name) {
  const double now = clock_();
  std::lock_guard<std::mutex> lock(mu_);
  if (!timeouts_.section.count(name)) return InvalidArgument("FT: section '", name, "' has no configured timeout");
  GALE_RETURN_IF_ERROR(calc_.open_section(name, now));
  open_[name] = now;
  return Status::Ok();
}

Status FtRankMonitor::end_section(const std::string& name) {
  const double now = clock_();
  std::lock_guard<std::mutex> lock(mu_);
  GALE_RETURN_IF_ERROR(calc_.close_section(name, now));
  open_.erase(name);
  if (open_.empty()) out_of_section_since_ = now;
  return Status::Ok();
}

void FtRankMonitor::end_all_sections() {
  const double now = clock_();
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [name, since] : open_) (void)calc_.close_section(name, now);
  open_.clear();
  out_of_section_since_ = now;
}

std::optional<FtTimeoutEvent> FtRankMonitor::check(double now) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const std::string& name : ft_section_names()) {
    auto it = open_.find(name);
    if (it == open_.end()) continue;
    auto t = timeouts_.section.find(name);
    if (t == timeouts_.section.end() || !t->second) continue;
    const double elapsed = now - it->second;
    if (elapsed > *t->second) return FtTimeoutEvent{name, elapsed, *t->second};
  }
  if (open_.empty() && out_of_section_monitored_ && timeouts_.out_of_section) {
    const double elapsed = now - out_of_section_since_;
    if (elapsed > *timeouts_.out_of_section) return FtTimeoutEvent{"", elapsed, *timeouts_.out_of_section};
  }
  return std::nullopt;
}

void FtRankMonitor::set_out_of_section_monitored(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  if (on && !out_of_section_monitored_ && open_.empty()) out_of_section_since_ = clock_();
  out_of_section_monitored_ = on;
}

FtSectionTimeouts FtRankMonitor::timeouts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return timeouts_;
}

void FtRankMonitor::set_timeouts(const FtSectionTimeouts& t) {
  std::lock_guard<std::mutex> lock(mu_);
  timeouts_ = t;
}

void FtRankMonitor::start_watchdog(double interval_seconds, TimeoutHandler on_timeout) {
  GALE_CHECK(!watchdog_.joinable()) << "FtRankMonitor::start_watchdog called twice";
  if (!on_timeout) {
    const int rank = rank_;
    on_timeout = [rank](const FtTimeoutEvent& e) { fatal_exit_from_thread(kFtHangExitCode, describe_ft_timeout(rank, e)); };
  }
  watchdog_ = std::thread([this, interval_seconds, on_timeout] { watch(interval_seconds, on_timeout); });
}

void FtRankMonitor::stop_watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
}

void FtRankMonitor::watch(double interval_seconds, TimeoutHandler on_timeout) {
  const auto interval = std::chrono::duration<double>(interval_seconds);
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (stop_cv_.wait_for(lock, interval, [this] { return stop_; })) return;
    }
    if (std::optional<FtTimeoutEvent> e = check(clock_())) {
      on_timeout(*e);
      return;  // reported once
    }
  }
}

}  // namespace gale
