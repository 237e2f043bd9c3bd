// Megatron's named timers with log levels and their across-ranks report.
#include "core/timers.h"

#include <algorithm>
#include <cstdio>

#include "core/check.h"

namespace gale {

std::optional<TimingLogOption> parse_timing_log_option(std::string_view s) {
  if (s == "max") return TimingLogOption::kMax;
  if (s == "minmax") return TimingLogOption::kMinMax;
  if (s == "all") return TimingLogOption::kAll;
  return std::nullopt;
}

Timer::Timer(std::string name, bool enabled, const std::function<void()>* barrier)
    : name_(std::move(name)), enabled_(enabled), barrier_(barrier) {}

void Timer::start(bool barrier) {
  if (!enabled_) return;
  GALE_CHECK(!started_) << "timer " << name_ << " has already been started";
  if (barrier && barrier_ && *barrier_) (*barrier_)();
  start_time_ = Clock::now();
  started_ = true;
}

void Timer::stop(bool barrier) {
  if (!enabled_) return;
  GALE_CHECK(started_) << "timer " << name_ << " is not started";
  if (barrier && barrier_ && *barrier_) (*barrier_)();
  const double seconds = std::chrono::duration<double>(Clock::now() - start_time_).count();
  elapsed_ += seconds;
  active_ += seconds;
  started_ = false;
}

void Timer::reset() {
  elapsed_ = 0.0;
  started_ = false;
}

double Timer::elapsed(bool reset) {
  GALE_CHECK(enabled_) << "a timer above --timing-log-level cannot be read";
  const bool was_started = started_;
  if (was_started) stop();
  const double seconds = elapsed_;
  if (reset) this->reset();
  if (was_started) start();
  return seconds;
}

Timers::Timers(int log_level, TimingLogOption option)
    : log_level_(log_level), option_(option), dummy_("dummy timer", /*enabled=*/false) {
  GALE_CHECK(log_level >= 0 && log_level <= kMaxLogLevel) << "timing log level " << log_level;
}

Timer& Timers::operator()(std::string_view name, int level) {
  GALE_CHECK(level >= 0 && level <= kMaxLogLevel) << "timer " << name << ": log level " << level;
  if (level > log_level_) return dummy_;  // nothing to look up: such a timer is never created
  auto it = timers_.find(name);
  if (it != timers_.end()) {
    GALE_CHECK_EQ(levels_.find(name)->second, level) << "timer " << name << " asked for at another log level";
    return it->second;
  }
  levels_.emplace(std::string(name), level);
  return timers_.emplace(std::string(name), Timer(std::string(name), true, &barrier_)).first->second;
}

std::vector<double> Timers::elapsed(const std::vector<std::string>& names, bool reset) {
  std::vector<double> out(names.size(), 0.0);
  for (size_t i = 0; i < names.size(); ++i) {
    auto it = timers_.find(names[i]);
    if (it != timers_.end()) out[i] = it->second.elapsed(reset);
  }
  return out;
}

ScopedTimer::ScopedTimer(Timers* timers, const char* name, int level, bool barrier,
                         std::initializer_list<TraceArg> args) {
  if (!timers) return;
  trace_.emplace(TraceCategory::kStep, name, args);
  if ((observer_ = timers->scope_observer())) {
    name_ = name;
    observer_->scope_begin(name);
    start_ = std::chrono::steady_clock::now();
  }
  Timer& t = (*timers)(name, level);
  if (!t.enabled()) return;
  t.start(barrier);
  timer_ = &t;
}

void ScopedTimer::stop() {
  if (timer_) timer_->stop();
  timer_ = nullptr;
  if (observer_) {
    observer_->scope_end(name_, std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
    observer_ = nullptr;
  }
  if (trace_) trace_->finish();
}

std::vector<TimerMinMax> timers_min_max(const GatheredTimes& t, double normalizer) {
  GALE_CHECK(normalizer > 0.0) << "timer normalizer " << normalizer;
  std::vector<TimerMinMax> out;
  for (size_t i = 0; i < t.names.size(); ++i) {
    bool any = false;
    double lo = 0.0, hi = 0.0;
    for (int r = 0; r < t.world_size; ++r) {
      const double v = t.at(r, i);
      if (!(v > 0.0)) continue;  // ranks without this timer
      lo = any ? std::min(lo, v) : v;
      hi = any ? std::max(hi, v) : v;
      any = true;
    }
    if (any) out.push_back({t.names[i], lo / normalizer, hi / normalizer});
  }
  return out;
}

namespace {

std::string two_decimals(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

// "<name> " padded with dots to 48 characters (Python's ljust: longer names stay whole).
std::string dotted(const std::string& name) {
  std::string s = name + " ";
  if (s.size() < 48) s.append(48 - s.size(), '.');
  return s;
}

}  // namespace

std::optional<std::string> format_timers(TimingLogOption option, const GatheredTimes& t, double normalizer) {
  GALE_CHECK(normalizer > 0.0) << "timer normalizer " << normalizer;
  const double to_ms = normalizer / 1000.0;  // seconds per iteration -> milliseconds
  if (option == TimingLogOption::kAll) {
    std::string out = "times across ranks (ms):";
    bool any = false;
    for (size_t i = 0; i < t.names.size(); ++i) {
      bool named = false;
      for (int r = 0; r < t.world_size; ++r) {
        const double v = t.at(r, i);
        if (!(v > 0.0)) continue;
        any = true;
        if (!named) out += "\n  " + t.names[i] + ":";
        named = true;
        char rank[16];
        std::snprintf(rank, sizeof rank, "%2d", r);
        out += std::string("\n     rank ") + rank + ": " + two_decimals(v / to_ms);
      }
    }
    if (!any) return std::nullopt;
    return out;
  }
  const std::vector<TimerMinMax> mm = timers_min_max(t, to_ms);
  if (mm.empty()) return std::nullopt;
  const bool max_only = option == TimingLogOption::kMax;
  std::string out = max_only ? "max time across ranks (ms):" : "(min, max) time across ranks (ms):";
  for (const TimerMinMax& m : mm) {
    out += "\n    " + dotted(m.name) + ": ";
    out += max_only ? two_decimals(m.max) : "(" + two_decimals(m.min) + ", " + two_decimals(m.max) + ")";
  }
  return out;
}

}  // namespace gale
