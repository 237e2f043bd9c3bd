// Megatron's rerun state machine (--rerun-mode): reruns an iteration whose checked results fail, to
// tell a transient hardware fault from a reproducible result.
//
// The trainer runs each iteration's forward and backward passes in a loop:
//
//   while (rsm.should_run_forward_backward(iteration)) {
//     zero the gradients, forward + backward, then validate_result(...) for each checked value
//   }
//   decision = rsm.should_checkpoint_and_exit();   // save and/or exit with decision.exit_code
//   optimizer step
//
// --rerun-mode validate_results (Megatron's states and exit codes):
//   1. initial run: a check rejects a result (NaN or Inf loss, a spiky loss, NaN/Inf/large
//      gradients, or an injected error) → every rank reruns the passes in place, from the same
//      parameters and samples (Gale's passes are a function of those: dropout is keyed by seed,
//      sample and position, so nothing else needs restoring);
//   2. in-place rerun: the same call's result differs → "possible transient error": a fatal check
//      exits with 17 (kExitFailedOnResultValidation), a non-fatal one continues; it is the same
//      (tolerance 0: Gale's passes are deterministic) → a fatal check saves a checkpoint of the
//      iteration's start (with this machine's state) and exits with 16 (kExitResumeToDisambiguate)
//      so the job can be resumed on other hardware; a non-fatal one continues;
//   3. resumed from that checkpoint: on the same node and device as the failure (node: the host
//      name, or $GALE_NODE_NAME when set; device: the rank on its node) → exit 16 again; otherwise
//      the result differs → "possible persistent error" (the first hardware was faulty), the same →
//      "correct result (but possible application error)"; both exit with 17 for a fatal check.
// The first iteration of a job is not validated (a checkpoint needs one optimizer step first).
// --rerun-mode report_stats: every iteration runs twice and the relative differences of each
// check's values are reported every 2 iterations (all 0 in Gale: its passes are deterministic).
// --rerun-mode disabled: fatal rejections are errors, non-fatal ones warnings; nothing reruns.
// --error-injection-rate N: each validation of an initial run rejects its result with probability
// 1/N (one injection per iteration at most; the draw is keyed by --seed, rank and validation), and
// the reruns behave as --error-injection-type says (correct_result, transient_error, persistent_error);
// after a non-fatal check's diagnosis training goes on and later validations may inject again
// (Megatron's injector stays spent after an in-place correct_result or persistent_error).
// Every rank takes every decision together (one all-reduce of the flags per decision).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "core/status.h"

namespace gale {

constexpr int kExitResumeToDisambiguate = 16;     // Megatron's EXIT_CODE_RESUME_TO_DISAMBIGUATE
constexpr int kExitFailedOnResultValidation = 17;  // Megatron's EXIT_CODE_FAILED_ON_RESULT_VALIDATION

enum class RerunMode { kDisabled, kValidateResults, kReportStats };
enum class RerunDiagnostic { kCorrectResult, kTransientError, kPersistentError };

struct RerunConfig {
  RerunMode mode = RerunMode::kDisabled;
  int64_t error_injection_rate = 0;  // 0: no injection
  RerunDiagnostic error_injection_type = RerunDiagnostic::kTransientError;
  std::string tracker_filename;  // --result-rejected-tracker-filename ("" = none)
  uint64_t seed = 1234;          // keys the injection draws
};

// Parses --rerun-mode / --error-injection-type values (the flag parser has checked the choices).
RerunMode parse_rerun_mode(const std::string& mode);
RerunDiagnostic parse_rerun_diagnostic(const std::string& type);

// The relative difference of two results: 0 when equal (NaN = NaN), +inf when one is NaN or Inf
// and the other is not, else |a − b| / |(a + b) / 2| (Megatron's _compare_floats).
double compare_results(double a, double b);

// Distribution of a statistic (Megatron's QuickStats): zeros counted apart, the rest kept (up to
// max_size samples) for percentiles.
class QuickStats {
 public:
  explicit QuickStats(size_t max_size = 100000) : max_size_(max_size) {}
  void record(double value);
  void combine(const QuickStats& other);
  // "N/Z total/identical samples, rel. variability: avg= ..., p50= ..., p90= ..., p99= ...,
  // p99.9= ..., max: ..." or "Z samples, all identical".
  std::string describe() const;
  std::vector<double> serialise() const;  // [zeros, max, samples...]
  static QuickStats deserialise(const double* data, size_t n);

 private:
  std::vector<double> samples_;
  size_t pos_ = 0, max_size_;
  int64_t zeros_ = 0;
  double max_ = 0.0;
};

class RerunStateMachine {
 public:
  // `world`: the decisions' all-reduces (null or size 1: this process alone). `node`: the host
  // name (or $GALE_NODE_NAME); `device`: the rank's index on its node.
  RerunStateMachine(RerunConfig config, Communicator* world, std::string node, int device);

  RerunMode mode() const { return config_.mode; }

  // True while the forward and backward passes of `iteration` (0-based: the iterations done
  // before it) must (re)run. The caller zeroes the gradients and drops per-iteration sums
  // before each run.
  bool should_run_forward_backward(int64_t iteration);

  struct Decision {
    bool checkpoint = false;  // save a checkpoint of the iteration's start (its state_dict included)
    bool exit = false;        // then end the job with exit_code
    int exit_code = 0;
  };
  Decision should_checkpoint_and_exit();

  // Checks `result` with `reject` (true: unexpected). `fatal`: a confirmed failure ends the job;
  // otherwise training continues after the diagnosis. `tolerance`: the relative difference a
  // rerun may show and still reproduce the result. Disabled mode: a fatal rejection is returned
  // as an error, a non-fatal one printed as a warning.
  Status validate_result(double result, const std::function<bool(double)>& reject, const std::string& message,
                         double tolerance, bool fatal);

  // A rejection function: true when |value| >= threshold × the largest |value| of the first
  // `num_samples` values seen under `context` (those never reject; NaN and Inf never do).
  bool is_unexpectedly_large(double value, double threshold, const std::string& context, int num_samples = 100);

  // What a checkpoint keeps (Megatron's "rerun_state_machine"): null unless a rerun from the
  // checkpoint is pending. Collective: the ranks' failure records are gathered (every rank
  // returns the same value).
  nlohmann::json state_dict() const;
  // Restores a state_dict of a checkpoint (null: nothing to do); errors name `where`.
  Status load_state_dict(const nlohmann::json& state, const std::string& where);

  // The lines of the last report_stats report (rank 0), for tests.
  const std::vector<std::string>& last_report() const { return last_report_; }

 private:
  enum class State {
    kNotRunningYet,
    kInitialRun,
    kRerunningInPlace,
    kWillRerunFromCheckpoint,
    kRerunningFromCheckpoint,
    kRerunningAgainFromCheckpoint
  };
  using Call = std::pair<std::string, int64_t>;  // (message, its sequence number in this run)

  bool any(bool value) const;  // true when some rank's value is true
  std::pair<bool, bool> any(bool a, bool b) const;
  Call next_call(const std::string& message);
  bool maybe_inject();
  double maybe_miscompare(double initial, double rerun, State state);
  void track(const std::string& status, double result, const std::string& message) const;
  void log_failure(const std::string& message, bool fatal) const;
  void maybe_report_stats();

  RerunConfig config_;
  Communicator* world_;
  std::string node_;
  int device_;
  int rank_ = 0;
  State state_ = State::kNotRunningYet;
  int64_t iteration_ = -1;
  bool first_iteration_complete_ = false;
  bool rerun_requested_ = false, checkpoint_requested_ = false, restart_again_requested_ = false,
       continue_requested_ = false, logged_enabled_ = false;
  std::map<std::string, int64_t> validation_counts_;
  bool has_failed_call_ = false;
  Call failed_call_;
  double initial_result_ = 0.0;
  std::string suspicious_node_;
  int suspicious_device_ = -1;
  bool injected_ = false;  // an injected error awaits its reruns
  int64_t injection_draws_ = 0;
  std::map<std::string, int64_t> large_value_counts_;
  std::map<std::string, double> max_values_;
  std::map<Call, double> saved_results_;         // report_stats: the initial run's results
  std::map<std::string, QuickStats> stats_;      // report_stats: per check message
  std::vector<std::string> last_report_;
};

}  // namespace gale
