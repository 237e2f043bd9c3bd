// Megatron's rerun state machine (train/rerun_state_machine.h).
#include "train/rerun_state_machine.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "core/check.h"
#include "core/log.h"
#include "core/rng.h"

namespace gale {

namespace {

std::string sci(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3E", v);
  return buf;
}

// Every rank's `text`, in rank order (one all-gather of the texts padded to the longest).
std::vector<std::string> gather_texts(Communicator* world, const std::string& text) {
  if (!world || world->size() == 1) return {text};
  int64_t len = static_cast<int64_t>(text.size());
  world->all_reduce(&len, 1, DType::kI64, ReduceOp::kMax);
  std::string padded = text;
  padded.resize(static_cast<size_t>(len) + 1, '\0');
  std::string all(padded.size() * static_cast<size_t>(world->size()), '\0');
  world->all_gather(padded.data(), all.data(), static_cast<int64_t>(padded.size()), DType::kU8);
  std::vector<std::string> texts;
  for (int r = 0; r < world->size(); ++r) texts.emplace_back(all.c_str() + static_cast<size_t>(r) * padded.size());
  return texts;
}

// A result as Megatron's messages show it: nan, inf and -inf without the C library's sign of a NaN.
std::string shown(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return str_cat(v);
}

const char* diagnostic_name(RerunDiagnostic d) {
  switch (d) {
    case RerunDiagnostic::kCorrectResult: return "Expected result";
    case RerunDiagnostic::kTransientError: return "Transient error";
    case RerunDiagnostic::kPersistentError: return "Persistent error";
  }
  return "?";
}

}  // namespace

RerunMode parse_rerun_mode(const std::string& mode) {
  if (mode == "validate_results") return RerunMode::kValidateResults;
  if (mode == "report_stats") return RerunMode::kReportStats;
  GALE_CHECK(mode == "disabled") << "--rerun-mode " << mode;
  return RerunMode::kDisabled;
}

RerunDiagnostic parse_rerun_diagnostic(const std::string& type) {
  if (type == "correct_result") return RerunDiagnostic::kCorrectResult;
  if (type == "persistent_error") return RerunDiagnostic::kPersistentError;
  GALE_CHECK(type == "transient_error") << "--error-injection-type " << type;
  return RerunDiagnostic::kTransientError;
}

double compare_results(double a, double b) {
  if (a == b || (std::isnan(a) && std::isnan(b))) return 0.0;
  if (std::isnan(a) || std::isnan(b) || std::isinf(a) || std::isinf(b)) return INFINITY;
  return std::fabs((a - b) / (a + b) * 2.0);
}

void QuickStats::record(double value) {
  if (value == 0.0) {
    ++zeros_;
    return;
  }
  if (samples_.size() < max_size_) samples_.push_back(value);
  else samples_[pos_ % max_size_] = value;
  ++pos_;
  max_ = std::max(max_, value);
}

void QuickStats::combine(const QuickStats& other) {
  if (samples_.size() + other.samples_.size() <= max_size_) {
    samples_.insert(samples_.end(), other.samples_.begin(), other.samples_.end());
    pos_ = samples_.size();
  }
  zeros_ += other.zeros_;
  max_ = std::max(max_, other.max_);
}

std::string QuickStats::describe() const {
  std::vector<double> s = samples_;
  std::sort(s.begin(), s.end());
  const int64_t z = zeros_, n = static_cast<int64_t>(s.size());
  if (n == 0) return str_cat(z, " samples, all identical");
  const int64_t t = z + n;
  double sum = 0.0;
  for (double v : s) sum += v;
  auto pct = [&](double p) {
    const int64_t i = static_cast<int64_t>(static_cast<double>(t) * p) - z;
    return i >= 0 ? sci(s[static_cast<size_t>(std::min(i, n - 1))]) : std::string("0.0");
  };
  return str_cat(t, "/", z, " total/identical samples, rel. variability: avg= ", sci(sum / static_cast<double>(t)),
                 ", p50= ", pct(0.5), ", p90= ", pct(0.9), ", p99= ", pct(0.99), ", p99.9= ", pct(0.999),
                 ", max: ", sci(max_));
}

std::vector<double> QuickStats::serialise() const {
  std::vector<double> v = {static_cast<double>(zeros_), max_};
  v.insert(v.end(), samples_.begin(), samples_.end());
  return v;
}

QuickStats QuickStats::deserialise(const double* data, size_t n) {
  QuickStats q;
  GALE_CHECK(n >= 2) << "QuickStats: " << n << " values";
  q.zeros_ = static_cast<int64_t>(data[0]);
  q.max_ = data[1];
  q.samples_.assign(data + 2, data + n);
  q.pos_ = q.samples_.size();
  return q;
}

RerunStateMachine::RerunStateMachine(RerunConfig config, Communicator* world, std::string node, int device)
    : config_(std::move(config)), world_(world), node_(std::move(node)), device_(device) {
  rank_ = world_ ? world_->rank() : 0;
  if (!config_.tracker_filename.empty()) {
    std::ofstream f(config_.tracker_filename, std::ios::app);
    GALE_CHECK(f.good()) << "--result-rejected-tracker-filename " << config_.tracker_filename
                         << ": cannot be appended to";
  }
}

bool RerunStateMachine::any(bool value) const { return any(value, false).first; }

std::pair<bool, bool> RerunStateMachine::any(bool a, bool b) const {
  int64_t v[2] = {a ? 1 : 0, b ? 1 : 0};
  if (world_ && world_->size() > 1) world_->all_reduce(v, 2, DType::kI64, ReduceOp::kMax);
  return {v[0] != 0, v[1] != 0};
}

bool RerunStateMachine::should_run_forward_backward(int64_t iteration) {
  validation_counts_.clear();
  switch (state_) {
    case State::kNotRunningYet:
      iteration_ = iteration;
      state_ = State::kInitialRun;
      rerun_requested_ = checkpoint_requested_ = restart_again_requested_ = continue_requested_ = false;
      return true;
    case State::kInitialRun:
      if (config_.mode == RerunMode::kDisabled || !any(rerun_requested_)) {
        state_ = State::kNotRunningYet;
        return false;
      }
      if (config_.mode == RerunMode::kValidateResults)
        print_rank0("WARNING: Need to rerun step to check reproducibility of initial result");
      state_ = State::kRerunningInPlace;
      return true;
    case State::kRerunningInPlace: {
      if (config_.mode == RerunMode::kReportStats) {
        state_ = State::kNotRunningYet;
        maybe_report_stats();
        saved_results_.clear();
        return false;
      }
      const auto [will_continue, will_checkpoint] = any(continue_requested_, checkpoint_requested_);
      if (will_continue) {
        print_rank0("WARNING: Continuing normal execution because failed validation was not fatal");
        state_ = State::kNotRunningYet;
        injected_ = false;  // diagnosed: later validations may inject again
        return false;
      }
      if (will_checkpoint) state_ = State::kWillRerunFromCheckpoint;
      return false;
    }
    case State::kWillRerunFromCheckpoint:
      iteration_ = iteration;
      state_ = State::kRerunningFromCheckpoint;
      return true;
    case State::kRerunningFromCheckpoint: {
      const auto [again, will_continue] = any(restart_again_requested_, continue_requested_);
      if (again) {
        print_rank0("WARNING: Need to restart job from the same checkpoint because it was scheduled on the same "
                    "node/device");
        state_ = State::kRerunningAgainFromCheckpoint;
      } else if (will_continue) {
        print_rank0("WARNING: Continuing normal execution because failed validation was not fatal");
        state_ = State::kNotRunningYet;
        injected_ = false;
      }
      return false;
    }
    case State::kRerunningAgainFromCheckpoint: break;
  }
  GALE_CHECK(false) << "rerun state machine: should_run_forward_backward after the job was told to exit";
  return false;
}

RerunStateMachine::Decision RerunStateMachine::should_checkpoint_and_exit() {
  first_iteration_complete_ = true;
  if (config_.mode != RerunMode::kValidateResults) return {};
  switch (state_) {
    case State::kRerunningInPlace:
      print_rank0("WARNING: Exiting now. The job can be resumed from a previous checkpoint");
      return {false, true, kExitFailedOnResultValidation};
    case State::kWillRerunFromCheckpoint:
      print_rank0("WARNING: Saving a checkpoint and exiting now. Please resume the job from the checkpoint to rerun "
                  "the last iteration and establish a diagnostic");
      return {true, true, kExitResumeToDisambiguate};
    case State::kRerunningFromCheckpoint:
      print_rank0("WARNING: Exiting now. A checkpoint at the last iteration already exists if further examination "
                  "is needed");
      return {false, true, kExitFailedOnResultValidation};
    case State::kRerunningAgainFromCheckpoint:
      print_rank0("WARNING: Exiting now. Please resume the job from the same checkpoint to rerun the last iteration "
                  "and establish a diagnostic");
      return {false, true, kExitResumeToDisambiguate};
    default: return {};
  }
}

RerunStateMachine::Call RerunStateMachine::next_call(const std::string& message) {
  return {message, validation_counts_[message]++};
}

bool RerunStateMachine::maybe_inject() {
  if (config_.error_injection_rate <= 0 || injected_) return false;
  const uint64_t draw = mix_stream(config_.seed, 0x5EC, static_cast<uint64_t>(rank_),
                                   static_cast<uint64_t>(injection_draws_++));
  if (draw % static_cast<uint64_t>(config_.error_injection_rate) != 0) return false;
  injected_ = true;
  print_all(str_cat("WARNING: Injecting error type ", diagnostic_name(config_.error_injection_type)));
  return true;
}

double RerunStateMachine::maybe_miscompare(double initial, double rerun, State state) {
  if (!injected_) return compare_results(initial, rerun);
  const RerunDiagnostic t = config_.error_injection_type;
  if (state == State::kRerunningInPlace) {
    if (t != RerunDiagnostic::kTransientError) return 0.0;
    injected_ = false;
    return INFINITY;
  }
  injected_ = false;  // the rerun from the checkpoint
  return t == RerunDiagnostic::kPersistentError ? INFINITY : 0.0;
}

void RerunStateMachine::track(const std::string& status, double result, const std::string& message) const {
  if (config_.tracker_filename.empty()) return;
  const char* job = std::getenv("SLURM_JOBID");
  std::ofstream f(config_.tracker_filename, std::ios::app);
  f << "ts=" << timestamp_now() << " node=" << node_ << " device=" << device_ << " jobID=" << (job ? job : "N/A")
    << " rank=" << rank_ << " iteration=" << iteration_ + 1 << " status=" << status << " result=" << shown(result)
    << " message='" << message << "'\n";
  if (!f.good()) print_all("WARNING: could not write to --result-rejected-tracker-filename " + config_.tracker_filename);
}

void RerunStateMachine::log_failure(const std::string& message, bool fatal) const {
  print_all(str_cat(fatal ? "ERROR: " : "WARNING: ", "Rank ", rank_, ", node ", node_, ", device ", device_,
                    ", iteration #", iteration_ + 1, ": ", message, "!"));
}

Status RerunStateMachine::validate_result(double result, const std::function<bool(double)>& reject,
                                          const std::string& message, double tolerance, bool fatal) {
  if (config_.mode == RerunMode::kDisabled) {
    if (!reject(result)) return Status::Ok();
    track("rerun_disabled", result, message);
    const std::string full = str_cat("Rank ", rank_, ", node ", node_, ", device ", device_, ", iteration ",
                                     iteration_ + 1, ": Unexpected result ", shown(result), " (message='", message, "')");
    if (fatal) return FailedPrecondition(full);
    print_all("WARNING: " + full);
    return Status::Ok();
  }
  GALE_CHECK(state_ != State::kNotRunningYet) << "validate_result outside of the forward-backward passes";
  const Call call = next_call(message);
  if (config_.mode == RerunMode::kReportStats) {
    if (state_ == State::kInitialRun) {
      rerun_requested_ = true;
      saved_results_[call] = result;
    } else if (state_ == State::kRerunningInPlace) {
      auto it = saved_results_.find(call);
      GALE_CHECK(it != saved_results_.end()) << "report_stats: no initial result for '" << message << "' #"
                                             << call.second;
      stats_[message].record(compare_results(it->second, result));
    }
    return Status::Ok();
  }
  if (!logged_enabled_) {
    logged_enabled_ = true;
    print_rank0("WARNING: Result validation enabled");
  }
  if (state_ == State::kInitialRun && !rerun_requested_) {
    if (!first_iteration_complete_) return Status::Ok();  // no checkpoint can be taken before one step
    const bool rejected = maybe_inject() || reject(result);
    if (!rejected) return Status::Ok();
    has_failed_call_ = true;
    failed_call_ = call;
    initial_result_ = result;
    rerun_requested_ = true;
    track("initial_run", result, message);
    print_all(str_cat("ERROR: Unexpected result ", shown(result), " on rank ", rank_, " at iteration #", iteration_ + 1,
                      " invocation #", call.second, " (message='", message, "')"));
    return Status::Ok();
  }
  const bool rerunning = state_ == State::kRerunningInPlace || state_ == State::kRerunningFromCheckpoint;
  if (!rerunning || !has_failed_call_ || call != failed_call_) return Status::Ok();
  const double comparison = maybe_miscompare(initial_result_, result, state_);
  if (state_ == State::kRerunningInPlace) {
    if (comparison > tolerance) {
      if (!fatal) continue_requested_ = true;
      log_failure(str_cat("First rerun: unexpected result is not reproducible within the tolerance (", shown(result),
                          " != ", shown(initial_result_), ")"),
                  fatal);
      track("first_rerun_not_reproducible", result, message);
      log_failure("Possible transient error", fatal);
    } else {
      if (fatal) checkpoint_requested_ = true;
      else continue_requested_ = true;
      suspicious_node_ = node_;
      suspicious_device_ = device_;
      track("first_rerun_reproducible", result, message);
      log_failure(str_cat("First rerun: unexpected result is reproducible within the tolerance (", shown(result), " = ",
                          shown(initial_result_), "). Need to rerun on different hardware to verify correctness"),
                  fatal);
    }
    return Status::Ok();
  }
  // The rerun from the checkpoint, in a resumed job.
  if (node_ == suspicious_node_ && device_ == suspicious_device_) {
    print_all(str_cat("ERROR: Got rescheduled on the same node and device. Need to resume again from the same "
                      "checkpoint (node: ",
                      suspicious_node_, ", device: ", suspicious_device_, ")"));
    restart_again_requested_ = true;
  } else if (comparison > tolerance) {
    track("second_rerun_not_reproducible", result, message);
    print_all(str_cat("WARNING: Second rerun: unexpected result is not reproducible on different hardware, "
                      "therefore was likely incorrect (",
                      shown(result), " != ", shown(initial_result_), ")"));
    log_failure("Possible persistent error", true);
    if (!fatal) continue_requested_ = true;
  } else {
    track("second_rerun_reproducible", result, message);
    print_all(str_cat("WARNING: Second rerun: unexpected result is reproducible on different hardware, therefore it "
                      "was likely correct (",
                      shown(result), " = ", shown(initial_result_), ")"));
    log_failure(str_cat("Correct result (but possible Application error) (", message, ")"), true);
    if (!fatal) continue_requested_ = true;
  }
  return Status::Ok();
}

bool RerunStateMachine::is_unexpectedly_large(double value, double threshold, const std::string& context,
                                              int num_samples) {
  const double v = std::fabs(value);
  if (std::isnan(v) || std::isinf(v)) return false;
  int64_t& count = large_value_counts_[context];
  double& max_value = max_values_[context];
  if (count < num_samples) {
    ++count;
    max_value = std::max(max_value, v);
    if (count == num_samples) print_all(str_cat("WARNING: Max value for ", context, ": ", max_value));
    return false;
  }
  return v >= max_value * threshold;
}

void RerunStateMachine::maybe_report_stats() {
  constexpr int64_t kReportingIntervalIterations = 2;  // Megatron's REPORTING_INTERVAL_ITERATIONS
  if (iteration_ % kReportingIntervalIterations != 0) return;
  nlohmann::json mine = nlohmann::json::object();
  for (const auto& [message, stats] : stats_) mine[message] = stats.serialise();
  const std::vector<std::string> all = gather_texts(world_, mine.dump());
  last_report_.clear();
  if (rank_ != 0) {
    stats_.clear();
    return;
  }
  std::map<std::string, QuickStats> combined = stats_;
  for (size_t r = 1; r < all.size(); ++r) {
    const nlohmann::json theirs = nlohmann::json::parse(all[r]);  // outlives the loop over its items
    for (const auto& [message, values] : theirs.items()) {
      const std::vector<double> v = values.get<std::vector<double>>();
      QuickStats q = QuickStats::deserialise(v.data(), v.size());
      auto it = combined.find(message);
      if (it == combined.end()) combined.emplace(message, q);
      else it->second.combine(q);
    }
  }
  last_report_.push_back("Stats on computation determinism in validation calls");
  for (const auto& [message, stats] : combined) {
    last_report_.push_back(str_cat("  From validation call '", message, "':"));
    last_report_.push_back("    " + stats.describe());
  }
  stats_ = combined;  // rank 0 keeps the running totals, as Megatron's
  for (const std::string& line : last_report_) print_rank0(line);
}

nlohmann::json RerunStateMachine::state_dict() const {
  if (config_.mode != RerunMode::kValidateResults || state_ != State::kWillRerunFromCheckpoint) return nullptr;
  nlohmann::json mine = {{"failed", has_failed_call_},
                         {"message", failed_call_.first},
                         {"sequence", failed_call_.second},
                         {"initial_result", initial_result_},
                         {"suspicious_node", suspicious_node_},
                         {"suspicious_device", suspicious_device_},
                         {"injected", injected_},
                         {"injection_draws", injection_draws_}};
  if (std::isnan(initial_result_) || std::isinf(initial_result_))  // JSON has no NaN/Inf numbers
    mine["initial_result"] = std::isnan(initial_result_) ? "nan" : initial_result_ > 0 ? "inf" : "-inf";
  nlohmann::json ranks = nlohmann::json::array();
  for (const std::string& text : gather_texts(world_, mine.dump())) ranks.push_back(nlohmann::json::parse(text));
  return {{"version", 1}, {"state", "will_rerun_from_checkpoint"}, {"iteration", iteration_}, {"ranks", ranks}};
}

Status RerunStateMachine::load_state_dict(const nlohmann::json& state, const std::string& where) {
  if (state.is_null()) return Status::Ok();
  if (config_.mode != RerunMode::kValidateResults) {
    print_rank0(str_cat("WARNING: ", where, ": the checkpoint waits for a rerun of iteration ",
                        state.value("iteration", int64_t{-1}) + 1,
                        " to diagnose a rejected result; it is not rerun without --rerun-mode validate_results"));
    return Status::Ok();
  }
  try {
    if (state.at("version").get<int>() != 1 || state.at("state").get<std::string>() != "will_rerun_from_checkpoint")
      return InvalidArgument(where, ": rerun_state_machine: expected version 1, state will_rerun_from_checkpoint, found ",
                             state.dump());
    const nlohmann::json& ranks = state.at("ranks");
    const int size = world_ ? world_->size() : 1;
    if (static_cast<int>(ranks.size()) != size)
      return InvalidArgument(where, ": the pending rerun was saved by ", ranks.size(),
                             " ranks; resume it with the same number of ranks, found ", size);
    const nlohmann::json& r = ranks.at(static_cast<size_t>(rank_));
    has_failed_call_ = r.at("failed").get<bool>();
    failed_call_ = {r.at("message").get<std::string>(), r.at("sequence").get<int64_t>()};
    const nlohmann::json& init = r.at("initial_result");
    initial_result_ = init.is_string() ? std::strtod(init.get<std::string>().c_str(), nullptr) : init.get<double>();
    suspicious_node_ = r.at("suspicious_node").get<std::string>();
    suspicious_device_ = r.at("suspicious_device").get<int>();
    injected_ = r.at("injected").get<bool>();
    injection_draws_ = r.at("injection_draws").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(where, ": rerun_state_machine: ", e.what());
  }
  state_ = State::kWillRerunFromCheckpoint;
  print_rank0(str_cat("WARNING: rerunning iteration ", state.value("iteration", int64_t{-1}) + 1,
                      " from the checkpoint to diagnose the result it rejected"));
  return Status::Ok();
}

}  // namespace gale
