// The rerun state machine in one process: Megatron's states, decisions and exit codes for each
// injected diagnosis, real rejections, non-fatal checks, the checkpointed state, report_stats and
// the helpers (compare_results, QuickStats, is_unexpectedly_large).
#include "train/rerun_state_machine.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>

namespace gale {
namespace {

const std::function<bool(double)> kIsNan = [](double v) { return std::isnan(v); };
const std::function<bool(double)> kNever = [](double) { return false; };

RerunConfig validate(int64_t rate = 0, RerunDiagnostic type = RerunDiagnostic::kTransientError) {
  RerunConfig c;
  c.mode = RerunMode::kValidateResults;
  c.error_injection_rate = rate;
  c.error_injection_type = type;
  return c;
}

// One iteration whose passes return `result` each time they run; checked with `reject` (fatal).
// Returns how many times the passes ran, and the decision.
std::pair<int, RerunStateMachine::Decision> iteration(RerunStateMachine& m, int64_t it, double result,
                                                      const std::function<bool(double)>& reject = kIsNan,
                                                      bool fatal = true) {
  int runs = 0;
  while (m.should_run_forward_backward(it)) {
    ++runs;
    EXPECT_TRUE(m.validate_result(result, reject, "found NaN in local forward loss calculation", 0.0, fatal).ok());
  }
  return {runs, m.should_checkpoint_and_exit()};
}

TEST(RerunStateMachine, PassingResultsRunOnceAndTheFirstIterationIsNotValidated) {
  RerunStateMachine m(validate(), nullptr, "node", 0);
  auto [runs0, d0] = iteration(m, 0, NAN);  // iteration 1: never validated (no checkpoint possible yet)
  EXPECT_EQ(runs0, 1);
  EXPECT_FALSE(d0.exit);
  for (int64_t it = 1; it < 5; ++it) {
    auto [runs, d] = iteration(m, it, 2.5);
    EXPECT_EQ(runs, 1);
    EXPECT_FALSE(d.exit || d.checkpoint);
  }
  EXPECT_TRUE(m.state_dict().is_null());
}

TEST(RerunStateMachine, ReproducibleNanCheckpointsThenDiagnosesOnOtherHardware) {
  RerunStateMachine m(validate(), nullptr, "node-a", 0);
  iteration(m, 0, 1.0);
  auto [runs, d] = iteration(m, 1, NAN);  // initial run, then the in-place rerun reproduces NaN
  EXPECT_EQ(runs, 2);
  EXPECT_TRUE(d.checkpoint);
  EXPECT_TRUE(d.exit);
  EXPECT_EQ(d.exit_code, kExitResumeToDisambiguate);
  const nlohmann::json saved = m.state_dict();
  ASSERT_FALSE(saved.is_null());
  EXPECT_EQ(saved["iteration"], 1);
  EXPECT_EQ(saved["ranks"][0]["initial_result"], "nan");
  EXPECT_EQ(saved["ranks"][0]["suspicious_node"], "node-a");

  // Resumed on the same node and device: exit 16 again, nothing learnt.
  RerunStateMachine same(validate(), nullptr, "node-a", 0);
  ASSERT_TRUE(same.load_state_dict(saved, "test").ok());
  auto [runs_same, d_same] = iteration(same, 1, NAN);
  EXPECT_EQ(runs_same, 1);
  EXPECT_FALSE(d_same.checkpoint);
  EXPECT_EQ(d_same.exit_code, kExitResumeToDisambiguate);

  // Elsewhere: NaN again is a correct result of the application; fatal, so exit 17.
  RerunStateMachine other(validate(), nullptr, "node-b", 0);
  ASSERT_TRUE(other.load_state_dict(saved, "test").ok());
  auto [runs_other, d_other] = iteration(other, 1, NAN);
  EXPECT_EQ(runs_other, 1);
  EXPECT_EQ(d_other.exit_code, kExitFailedOnResultValidation);
  // Another device of the same node counts as other hardware too.
  RerunStateMachine device(validate(), nullptr, "node-a", 1);
  ASSERT_TRUE(device.load_state_dict(saved, "test").ok());
  EXPECT_EQ(iteration(device, 1, NAN).second.exit_code, kExitFailedOnResultValidation);
}

TEST(RerunStateMachine, InjectedDiagnoses) {
  // Rate 1: the first validated result is rejected.
  {
    RerunStateMachine m(validate(1, RerunDiagnostic::kTransientError), nullptr, "n", 0);
    iteration(m, 0, 1.0);
    auto [runs, d] = iteration(m, 1, 1.0);
    EXPECT_EQ(runs, 2);
    EXPECT_FALSE(d.checkpoint);  // not reproducible in place: transient, fatal → 17, no checkpoint
    EXPECT_EQ(d.exit_code, kExitFailedOnResultValidation);
  }
  for (RerunDiagnostic type : {RerunDiagnostic::kCorrectResult, RerunDiagnostic::kPersistentError}) {
    RerunStateMachine m(validate(1, type), nullptr, "n", 0);
    iteration(m, 0, 1.0);
    auto [runs, d] = iteration(m, 1, 1.0);
    EXPECT_EQ(runs, 2);
    EXPECT_TRUE(d.checkpoint);  // reproducible in place → checkpoint, exit 16
    EXPECT_EQ(d.exit_code, kExitResumeToDisambiguate);
    RerunStateMachine resumed(validate(1, type), nullptr, "m", 0);
    ASSERT_TRUE(resumed.load_state_dict(m.state_dict(), "test").ok());
    auto [runs2, d2] = iteration(resumed, 1, 1.0);
    EXPECT_EQ(runs2, 1);
    EXPECT_EQ(d2.exit_code, kExitFailedOnResultValidation);  // fatal either way
  }
}

TEST(RerunStateMachine, InjectionRateDrawsAboutOncePerNValidations) {
  // Rate 8 over many iterations without injection of a follow-up: each injected iteration reruns
  // (non-fatal check, so training continues).
  RerunStateMachine m(validate(8, RerunDiagnostic::kCorrectResult), nullptr, "n", 0);
  int reruns = 0;
  for (int64_t it = 0; it < 400; ++it) {
    int runs = 0;
    while (m.should_run_forward_backward(it)) {
      ++runs;
      ASSERT_TRUE(m.validate_result(1.0, kNever, "large grads", 0.0, /*fatal=*/false).ok());
    }
    EXPECT_FALSE(m.should_checkpoint_and_exit().exit);
    reruns += runs - 1;
  }
  EXPECT_GT(reruns, 400 / 8 / 2);  // 399 draws at 1/8: ~50 (binomial sd ~6.6)
  EXPECT_LT(reruns, 400 / 8 * 2);
}

TEST(RerunStateMachine, NonFatalCheckContinues) {
  RerunStateMachine m(validate(), nullptr, "n", 0);
  iteration(m, 0, 1.0, kIsNan, false);
  auto [runs, d] = iteration(m, 1, NAN, kIsNan, /*fatal=*/false);
  EXPECT_EQ(runs, 2);
  EXPECT_FALSE(d.exit || d.checkpoint);
  auto [runs2, d2] = iteration(m, 2, 1.0, kIsNan, false);  // back to normal
  EXPECT_EQ(runs2, 1);
  EXPECT_FALSE(d2.exit);
}

TEST(RerunStateMachine, OnlyTheFailedCallIsCompared) {
  RerunStateMachine m(validate(), nullptr, "n", 0);
  iteration(m, 0, 1.0);
  // Two calls with the same message: the second rejects; on the rerun the first differs (ignored)
  // and the second reproduces.
  int run = 0;
  while (m.should_run_forward_backward(1)) {
    ++run;
    ASSERT_TRUE(m.validate_result(run == 1 ? 1.0 : 7.0, kIsNan, "loss", 0.0, true).ok());
    ASSERT_TRUE(m.validate_result(NAN, kIsNan, "loss", 0.0, true).ok());
  }
  EXPECT_EQ(run, 2);
  const RerunStateMachine::Decision d = m.should_checkpoint_and_exit();
  EXPECT_EQ(d.exit_code, kExitResumeToDisambiguate);
  EXPECT_EQ(m.state_dict()["ranks"][0]["sequence"], 1);
}

TEST(RerunStateMachine, DisabledChecksWithoutRerunning) {
  RerunStateMachine m(RerunConfig{}, nullptr, "n", 0);
  ASSERT_TRUE(m.should_run_forward_backward(0));
  const Status fatal = m.validate_result(NAN, kIsNan, "found NaN in local forward loss calculation", 0.0, true);
  EXPECT_FALSE(fatal.ok());
  EXPECT_NE(fatal.message().find("iteration 1: Unexpected result nan (message='found NaN in local forward loss "
                                 "calculation')"),
            std::string::npos)
      << fatal.message();
  EXPECT_TRUE(m.validate_result(NAN, kIsNan, "Spiky loss", 0.0, false).ok());  // a warning only
  EXPECT_FALSE(m.should_run_forward_backward(0));
  EXPECT_FALSE(m.should_checkpoint_and_exit().exit);
}

TEST(RerunStateMachine, ReportStatsRunsEveryIterationTwice) {
  RerunConfig c;
  c.mode = RerunMode::kReportStats;
  RerunStateMachine m(c, nullptr, "n", 0);
  for (int64_t it = 0; it < 3; ++it) {
    int runs = 0;
    while (m.should_run_forward_backward(it)) {
      ++runs;
      ASSERT_TRUE(m.validate_result(runs == 1 ? 1.0 : (it == 2 ? 1.5 : 1.0), kNever, "loss", 0.0, true).ok());
    }
    EXPECT_EQ(runs, 2);
    EXPECT_FALSE(m.should_checkpoint_and_exit().exit);
  }
  // Reported after iterations 1 and 3 (0-based 0 and 2): 2 identical samples and one of 0.4.
  const std::vector<std::string>& report = m.last_report();
  ASSERT_EQ(report.size(), 3u);
  EXPECT_EQ(report[0], "Stats on computation determinism in validation calls");
  EXPECT_EQ(report[1], "  From validation call 'loss':");
  EXPECT_EQ(report[2], "    3/2 total/identical samples, rel. variability: avg= 1.333E-01, p50= 0.0, p90= 4.000E-01, "
                       "p99= 4.000E-01, p99.9= 4.000E-01, max: 4.000E-01");
}

TEST(RerunStateMachine, Helpers) {
  EXPECT_EQ(compare_results(2.0, 2.0), 0.0);
  EXPECT_EQ(compare_results(NAN, NAN), 0.0);
  EXPECT_TRUE(std::isinf(compare_results(NAN, 1.0)));
  EXPECT_TRUE(std::isinf(compare_results(INFINITY, 1.0)));
  EXPECT_DOUBLE_EQ(compare_results(1.0, 1.5), 0.4);
  QuickStats q;
  EXPECT_EQ(q.describe(), "0 samples, all identical");
  RerunStateMachine m(validate(), nullptr, "n", 0);
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(m.is_unexpectedly_large(1.0 + i, 10.0, "loss", 3));  // max 3
  EXPECT_FALSE(m.is_unexpectedly_large(29.9, 10.0, "loss", 3));
  EXPECT_TRUE(m.is_unexpectedly_large(-30.0, 10.0, "loss", 3));
  EXPECT_FALSE(m.is_unexpectedly_large(NAN, 10.0, "loss", 3));
  EXPECT_FALSE(m.is_unexpectedly_large(30.0, 10.0, "grads", 3));  // contexts are apart
}

TEST(RerunStateMachine, LoadErrorsNameTheCheckpoint) {
  RerunStateMachine m(validate(), nullptr, "n", 0);
  const Status bad = m.load_state_dict(nlohmann::json{{"version", 1}, {"state", "will_rerun_from_checkpoint"},
                                                      {"iteration", 3}, {"ranks", nlohmann::json::array({1, 2})}},
                                       "ckpt/iter_0000003");
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("ckpt/iter_0000003: the pending rerun was saved by 2 ranks"), std::string::npos)
      << bad.message();
  const Status version = m.load_state_dict(nlohmann::json{{"version", 2}}, "ckpt");
  EXPECT_FALSE(version.ok());
  // Without --rerun-mode validate_results a pending rerun is reported and not run.
  RerunStateMachine disabled(RerunConfig{}, nullptr, "n", 0);
  EXPECT_TRUE(disabled.load_state_dict(nlohmann::json{{"iteration", 3}}, "ckpt").ok());
  EXPECT_TRUE(disabled.should_run_forward_backward(3));
  EXPECT_FALSE(disabled.should_run_forward_backward(3));
}

}  // namespace
}  // namespace gale
