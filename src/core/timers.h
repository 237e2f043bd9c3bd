// Megatron's timers (megatron/core/timers.py): named wall-clock timers with a log level, and the
// "(min, max) time across ranks (ms):" report they print.
//
// A Timers object is created with --timing-log-level L (0..2) and --timing-log-option
// (max | minmax | all). timers(name, level) returns the named timer, created on first use with that
// level; a level above L returns a shared dummy timer whose start/stop do nothing (no lookup, no
// clock read), so detailed timers cost nothing unless asked for. A timer accumulates the seconds
// between its start() and stop() calls until elapsed(reset=true) reads and clears them (a running
// timer is read up to now and keeps running), exactly as Megatron's.
//
// Gale's names and levels (Megatron's; the caller in parentheses):
//   level 0: save-checkpoint (trainer, around every save), save-checkpoint-non-persistent (trainer,
//            around every --non-persistent-save-interval save), load-checkpoint (pretrain, --load),
//            model-and-optimizer-setup, train/valid/test-data-iterators-setup (pretrain start-up);
//            each printed on its own by the code that times it.
//   level 1: forward-backward (the schedule plus finalize_model_grads), all-grads-sync (the
//            data-parallel reduction), layernorm-grads-all-reduce (sequence-parallel gradients over
//            TP), embedding-grads-all-reduce (tied embeddings over the embedding group; with PP),
//            params-all-gather (distributed optimizer, without --overlap-param-gather),
//            optimizer-unscale-and-check-inf (--fp16), optimizer-clip-main-grad (the gradient norm and
//            clipping), optimizer-count-zeros, optimizer-inner-step, optimizer-copy-main-to-model-params
//            (--bf16/--fp16: the half-precision GEMM copy of the new weights), optimizer (all of the step).
//   level 2: batch-generator (reading a micro-batch), forward-compute, backward-compute, and with
//            pipeline parallelism forward-recv, forward-send, backward-recv, backward-send.
// Megatron timers with no Gale counterpart are absent: optimizer-copy-to-main-grad (Gale's gradients
// are fp32 main gradients already), the fused pipeline exchanges (forward-send-forward-recv,
// forward-send-backward-recv, backward-send-forward-recv, backward-send-backward-recv,
// forward-backward-send-forward-backward-recv: Gale posts each transfer on its own), and the
// start-up timestamps, RL and EMA timers.
//
// The report functions below format times already gathered from every rank (train/timers_log.h
// does the collective), so they are testable without processes.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/trace.h"

namespace gale {

// --timing-log-option: what the report shows for each timer across ranks.
enum class TimingLogOption { kMax, kMinMax, kAll };
// "max", "minmax" or "all"; nullopt for anything else.
std::optional<TimingLogOption> parse_timing_log_option(std::string_view s);

class Timer {
 public:
  explicit Timer(std::string name, bool enabled = true, const std::function<void()>* barrier = nullptr);
  const std::string& name() const { return name_; }
  bool enabled() const { return enabled_; }
  bool started() const { return started_; }

  // `barrier`: first wait for every rank (Megatron's barrier=True; the Timers' barrier function).
  // Starting a started timer or stopping a stopped one is a programming error (GALE_CHECK).
  void start(bool barrier = false);
  void stop(bool barrier = false);
  // Clears the accumulated time and the running state (active_time is kept, as Megatron's).
  void reset();
  // Seconds accumulated so far (a running timer is read up to now and keeps running); with
  // `reset` the accumulated time is cleared. A dummy timer must not be read (GALE_CHECK).
  double elapsed(bool reset = true);
  // Every second this timer has run since it was created (never reset).
  double active_time() const { return active_; }
  void set_elapsed(double seconds) { elapsed_ = seconds; }

 private:
  using Clock = std::chrono::steady_clock;
  std::string name_;
  bool enabled_;
  const std::function<void()>* barrier_;
  bool started_ = false;
  double elapsed_ = 0.0, active_ = 0.0;
  Clock::time_point start_time_{};
};

// Told of every ScopedTimer scope of a Timers object, whatever the timer's level and
// --timing-log-level, on the thread that runs the scope (--log-straggler's detector,
// train/straggler_detector.h, times the forward compute and get_batch through it). Unset, a scope
// costs one branch more.
class TimerScopeObserver {
 public:
  virtual ~TimerScopeObserver() = default;
  virtual void scope_begin(const char* name) = 0;
  virtual void scope_end(const char* name, double seconds) = 0;
};

class Timers {
 public:
  static constexpr int kMaxLogLevel = 2;

  // `log_level`: --timing-log-level (0..kMaxLogLevel, GALE_CHECKed; the flag is validated first).
  Timers(int log_level, TimingLogOption option);
  Timers(const Timers&) = delete;
  Timers& operator=(const Timers&) = delete;

  int log_level() const { return log_level_; }
  TimingLogOption log_option() const { return option_; }
  // The barrier of start(true)/stop(true) (Megatron's global process group); none: no wait.
  void set_barrier(std::function<void()> barrier) { barrier_ = std::move(barrier); }
  // Whether level-1 timers start after the barrier (Megatron's barrier_with_L1_time, on by default;
  // off with --no-barrier-with-level-1-timing). Every rank must then run them the same times.
  void set_barrier_with_level1(bool on) { barrier_with_level1_ = on; }
  bool barrier_with_level1() const { return barrier_with_level1_; }

  // The timer `name`, created at `level` on first use; the dummy timer when `level` is above
  // --timing-log-level. A known name asked for at another level is a programming error.
  Timer& operator()(std::string_view name, int level = kMaxLogLevel);
  bool has(std::string_view name) const { return timers_.find(name) != timers_.end(); }

  // This rank's elapsed seconds of each of `names` (0 for a name with no timer), reset when asked.
  std::vector<double> elapsed(const std::vector<std::string>& names, bool reset);

  void set_scope_observer(TimerScopeObserver* observer) { observer_ = observer; }
  TimerScopeObserver* scope_observer() const { return observer_; }

 private:
  TimerScopeObserver* observer_ = nullptr;
  int log_level_;
  TimingLogOption option_;
  std::function<void()> barrier_;
  bool barrier_with_level1_ = true;
  std::map<std::string, Timer, std::less<>> timers_;
  std::map<std::string, int, std::less<>> levels_;
  Timer dummy_;
};

// Starts a timer (none when `timers` is null) and stops it at the end of the scope or at stop().
// The same scope is a step-phase span of --profile's trace (core/trace.h), whatever the timer's
// level, with `args` (the micro-batch and model chunk of forward-compute / backward-compute);
// `name` must outlive the scope (a string literal).
class ScopedTimer {
 public:
  ScopedTimer(Timers* timers, const char* name, int level, bool barrier = false,
              std::initializer_list<TraceArg> args = {});
  // A level-1 timer, started after the barrier when the timers say so (barrier_with_level1).
  static ScopedTimer level1(Timers* timers, const char* name) {
    return ScopedTimer(timers, name, 1, timers && timers->barrier_with_level1());
  }
  ~ScopedTimer() { stop(); }
  ScopedTimer(const ScopedTimer&) = delete;
  ScopedTimer& operator=(const ScopedTimer&) = delete;
  void stop();

 private:
  // Opened only with timers (a null `timers` means the scope is not timed, nor traced).
  std::optional<TraceScope> trace_;
  Timer* timer_ = nullptr;
  TimerScopeObserver* observer_ = nullptr;  // the timers' observer, until the scope ends
  const char* name_ = nullptr;
  std::chrono::steady_clock::time_point start_;
};

// Seconds of every rank for each timer: times[r · names.size() + i] is names[i] on rank r, as
// Megatron gathers them (float32; 0 where the rank has no such timer).
struct GatheredTimes {
  std::vector<std::string> names;
  std::vector<float> times;
  int world_size = 1;
  float at(int rank, size_t i) const { return times[static_cast<size_t>(rank) * names.size() + i]; }
};

// Megatron's min and max across ranks of each timer, divided by `normalizer`, over the ranks with
// a positive time; timers no rank ran are left out. In `names` order.
struct TimerMinMax {
  std::string name;
  double min = 0.0, max = 0.0;
};
std::vector<TimerMinMax> timers_min_max(const GatheredTimes& t, double normalizer);

// Megatron's report (Timers.get_all_timers_string) of the gathered seconds divided by
// `normalizer` (the iterations they cover), in milliseconds:
//   minmax: "(min, max) time across ranks (ms):" then "\n    <name> ....: (1.23, 4.56)" per timer,
//           the name and a space padded with dots to 48 characters;
//   max:    "max time across ranks (ms):" then "\n    <name> ....: 4.56";
//   all:    "times across ranks (ms):" then "\n  <name>:" and "\n     rank  r: 1.23" for each rank
//           with a positive time.
// nullopt when no timer has a positive time on any rank (Megatron then prints nothing).
std::optional<std::string> format_timers(TimingLogOption option, const GatheredTimes& t, double normalizer);

}  // namespace gale
