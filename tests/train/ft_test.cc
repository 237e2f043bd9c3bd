// --enable-ft-package without a job: the section timeouts' flags and their errors, the timeouts
// calculated from hand-made intervals (FT's safety factor and mean with earlier values), the
// monitor's bookkeeping and checks on an injected clock, its watchdog thread, the ft_state.json
// round trip, and Megatron's integration logic (warm-up, sections, when timeouts are recalculated,
// a resumed run taking the stored timeouts) on one process.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "comm/communicator.h"
#include "pretrain_cli.h"
#include "train/arguments.h"
#include "train/ft_integration.h"
#include "train/ft_rank_monitor.h"
#include "train/ft_timeouts.h"

namespace gale {
namespace {

namespace fs = std::filesystem;
using Timeouts = std::map<std::string, std::optional<double>>;

FtSectionTimeouts configured(std::optional<double> setup, std::optional<double> step, std::optional<double> ckpt,
                             std::optional<double> oos) {
  FtSectionTimeouts t;
  t.section = {{"setup", setup}, {"step", step}, {"checkpointing", ckpt}};
  t.out_of_section = oos;
  return t;
}

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("gale_ft_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// ---- flags ----

TEST(FtTimeouts, ParsesLauncherSyntax) {
  Timeouts t;
  ASSERT_TRUE(parse_ft_section_timeouts("setup:600,step:180,checkpointing:420", "--f", &t).ok());
  EXPECT_EQ(t, (Timeouts{{"setup", 600.0}, {"step", 180.0}, {"checkpointing", 420.0}}));
  ASSERT_TRUE(parse_ft_section_timeouts(" step : 2.5 , setup:None,checkpointing:", "--f", &t).ok());
  EXPECT_EQ(t, (Timeouts{{"setup", std::nullopt}, {"step", 2.5}, {"checkpointing", std::nullopt}}));
  std::optional<double> oos = 1.0;
  ASSERT_TRUE(parse_ft_timeout("null", "--g", &oos).ok());
  EXPECT_FALSE(oos.has_value());
}

TEST(FtTimeouts, RefusesBadSectionsByName) {
  Timeouts t;
  Status s = parse_ft_section_timeouts("setup:600,step:180", "--ft-param-rank_section_timeouts", &t);
  EXPECT_NE(s.message().find("--ft-param-rank_section_timeouts: expected a timeout for each of setup, step and "
                             "checkpointing (none for no timeout), found none for 'checkpointing'"),
            std::string::npos)
      << s.message();
  s = parse_ft_section_timeouts("setup:600,step:180,checkpointing:420,init:5", "--x", &t);
  EXPECT_NE(s.message().find("--x: unknown section 'init'"), std::string::npos) << s.message();
  s = parse_ft_section_timeouts("setup:600,step:-1,checkpointing:420", "--x", &t);
  EXPECT_NE(s.message().find("--x (section step): expected a positive number of seconds or none, found '-1'"),
            std::string::npos)
      << s.message();
  s = parse_ft_section_timeouts("setup=600", "--x", &t);
  EXPECT_NE(s.message().find("expected section:seconds entries"), std::string::npos) << s.message();
}

TEST(FtArgs, ValidationNamesTheFlags) {
  using testing::expect_one_line_error;
  expect_one_line_error({{"--calc-ft-timeouts"}, 1, "--calc-ft-timeouts needs --enable-ft-package"});
  expect_one_line_error(
      {{"--ft-param-rank_out_of_section_timeout", "30"}, 1, "--ft-param-rank_out_of_section_timeout needs --enable-ft-package"});
  expect_one_line_error({{"--enable-ft-package"}, 1, "--enable-ft-package needs --save"});
  expect_one_line_error({{"--enable-ft-package", "--save", "/tmp/x", "--save-interval", "5", "--ft-param-rank_section_timeouts=step:5"},
                         1,
                         "--ft-param-rank_section_timeouts: expected a timeout for each of setup, step and checkpointing"});
  expect_one_line_error({{"--enable-ft-package", "--save", "/tmp/x", "--save-interval", "5", "--ft-param-rank_out_of_section_timeout", "0"},
                         1,
                         "--ft-param-rank_out_of_section_timeout: expected a positive number of seconds or none, found '0'"});
  expect_one_line_error({{"--enable-ft-package", "--save", "/tmp/x", "--save-interval", "5", "--ft-param-safety_factor", "0"}, 1,
                         "--ft-param-safety_factor: expected a number > 0, found 0"});
  expect_one_line_error({{"--enable-ft-package", "--save", "/tmp/x", "--save-interval", "5", "--ft-param-workload_check_interval", "-1"}, 1,
                         "--ft-param-workload_check_interval: expected a number of seconds > 0"});
  testing::PretrainCli ok;
  ASSERT_TRUE(ok.parse_minimal({"--enable-ft-package", "--calc-ft-timeouts", "--save", "/tmp/x", "--save-interval", "5",
                                "--ft-param-rank_section_timeouts=setup:none,step:10,checkpointing:none",
                                "--ft-param-rank_out_of_section_timeout=none"})
                  .ok());
  EXPECT_TRUE(ok.args.ft.enable_ft_package);
  EXPECT_TRUE(ok.args.ft.calc_ft_timeouts);
  EXPECT_EQ(ok.args.ft.rank_section_timeouts, "setup:none,step:10,checkpointing:none");
}

// ---- the calculation ----

// Intervals (seconds from the start at 0): out 0-1, setup 1-11, out 11-12, step 12-14, out 14-17,
// step 17-18, out 18-20, checkpointing 20-24. Longest: setup 10, step 2, checkpointing 4, out 3.
FtTimeoutsCalc observed_calc() {
  FtTimeoutsCalc c(0.0, 5.0);
  EXPECT_TRUE(c.open_section("setup", 1).ok());
  EXPECT_TRUE(c.close_section("setup", 11).ok());
  EXPECT_TRUE(c.open_section("step", 12).ok());
  EXPECT_TRUE(c.close_section("step", 14).ok());
  EXPECT_TRUE(c.open_section("step", 17).ok());
  EXPECT_TRUE(c.close_section("step", 18).ok());
  EXPECT_TRUE(c.open_section("checkpointing", 20).ok());
  EXPECT_TRUE(c.close_section("checkpointing", 24).ok());
  return c;
}

TEST(FtTimeoutsCalc, SafetyFactorTimesLongestInterval) {
  FtTimeoutsCalc c = observed_calc();
  EXPECT_EQ(c.maxima(), (std::vector<double>{3, 10, 2, 4}));  // out-of-section, setup, step, checkpointing
  const FtSectionTimeouts flags = configured(600, 180, 420, 300);
  StatusOr<FtSectionTimeouts> t = c.calculate({"step", "checkpointing"}, false, flags);
  ASSERT_TRUE(t.ok()) << t.status().message();
  FtSectionTimeouts want = configured(600, 10, 20, 300);  // 5 × 2, 5 × 4; the others kept
  want.calculated_sections = {"checkpointing", "step"};
  EXPECT_EQ(t.value(), want);
  // The stretch since the last close counts when asked (FT does it before every calculation).
  c.bump_out_of_section(40);  // 16 s out of section
  t = c.calculate({"setup", "step", "checkpointing"}, true, flags);
  ASSERT_TRUE(t.ok());
  want = configured(50, 10, 20, 80);
  want.calculated_sections = {"checkpointing", "setup", "step"};
  want.is_out_of_section_calculated = true;
  EXPECT_EQ(t.value(), want);
}

TEST(FtTimeoutsCalc, MergesWithEarlierCalculatedValuesByTheirMean) {
  FtSectionTimeouts earlier = configured(600, 30, 420, 300);
  earlier.calculated_sections = {"step"};
  FtTimeoutsCalc c = observed_calc();
  StatusOr<FtSectionTimeouts> t = c.calculate({"step", "checkpointing"}, false, earlier);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->section.at("step"), 20.0);           // (30 + 5 × 2) / 2
  EXPECT_EQ(t->section.at("checkpointing"), 20.0);  // configured before: the new value
  EXPECT_EQ(t->section.at("setup"), 600.0);
  // The ranks' maxima come back from the all-reduce (their maximum): step 6 s, out of section 7 s.
  c.set_maxima({7, 10, 6, 4});
  t = c.calculate({"step"}, true, earlier);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->section.at("step"), 30.0);  // (30 + 5 × 6) / 2
  EXPECT_EQ(t->out_of_section, 35.0);      // 5 × 7: not calculated before
}

TEST(FtTimeoutsCalc, RefusesWhatWasNotObserved) {
  FtTimeoutsCalc c(0.0, 5.0);
  EXPECT_FALSE(c.calculate({"step"}, false, configured(1, 1, 1, 1)).ok());
  EXPECT_FALSE(c.calculate({}, true, configured(1, 1, 1, 1)).ok());
  EXPECT_FALSE(c.close_section("step", 1).ok());
  ASSERT_TRUE(c.open_section("step", 1).ok());
  EXPECT_FALSE(c.open_section("step", 2).ok());
  EXPECT_FALSE(c.open_section("init", 2).ok());
}

// ---- the monitor ----

struct FakeClock {
  std::shared_ptr<std::atomic<double>> t = std::make_shared<std::atomic<double>>(100.0);
  FtRankMonitor::Clock fn() const {
    auto p = t;
    return [p] { return p->load(); };
  }
  void set(double v) { t->store(v); }
};

TEST(FtRankMonitor, ChecksOpenSectionsThenOutOfSection) {
  FakeClock clock;
  FtRankMonitor m(3, configured(10, 2, std::nullopt, 5), 5.0, clock.fn());
  EXPECT_FALSE(m.check(105.0).has_value());  // out of section since 100: 5 s is not more than 5
  std::optional<FtTimeoutEvent> e = m.check(105.5);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->section, "");
  EXPECT_DOUBLE_EQ(e->elapsed, 5.5);
  EXPECT_DOUBLE_EQ(e->timeout, 5.0);
  EXPECT_NE(describe_ft_timeout(3, *e).find("FT: rank 3: has been out of any section for 5.50 s, more than the "
                                            "out-of-section timeout of 5.00 s"),
            std::string::npos);

  clock.set(101);
  ASSERT_TRUE(m.start_section("setup").ok());
  EXPECT_FALSE(m.check(110.0).has_value());  // 9 s open, timeout 10; no out-of-section check inside
  clock.set(104);
  ASSERT_TRUE(m.start_section("checkpointing").ok());  // nested; no timeout
  e = m.check(111.5);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->section, "setup");
  EXPECT_DOUBLE_EQ(e->elapsed, 10.5);
  EXPECT_NE(describe_ft_timeout(1, *e).find("FT: rank 1: section 'setup' has been open for 10.50 s, more than its "
                                            "timeout of 10.00 s (--ft-param-rank_section_timeouts)"),
            std::string::npos);
  EXPECT_NE(describe_ft_timeout(1, *e).find("exit code 75"), std::string::npos);
  clock.set(105);
  ASSERT_TRUE(m.end_section("setup").ok());
  EXPECT_FALSE(m.check(1000.0).has_value());  // only checkpointing open, without a timeout
  clock.set(106);
  m.end_all_sections();
  EXPECT_FALSE(m.check(111.0).has_value());
  EXPECT_TRUE(m.check(111.1).has_value());  // out of section again since 106
  // Errors.
  EXPECT_FALSE(m.end_section("step").ok());
  ASSERT_TRUE(m.start_section("step").ok());
  EXPECT_FALSE(m.start_section("step").ok());
  // Timeouts replaced at once.
  FtSectionTimeouts longer = configured(10, 100, std::nullopt, 5);
  EXPECT_TRUE(m.check(109.0).has_value());
  m.set_timeouts(longer);
  EXPECT_FALSE(m.check(109.0).has_value());
  // The observed intervals went to the calculator: setup 101-105, checkpointing 104-106.
  EXPECT_DOUBLE_EQ(m.calc().section_max("setup"), 4.0);
  EXPECT_DOUBLE_EQ(m.calc().section_max("checkpointing"), 2.0);
}

TEST(FtRankMonitor, WatchdogReportsATimeoutOnce) {
  FakeClock clock;
  FtRankMonitor m(0, configured(std::nullopt, 1, std::nullopt, std::nullopt), 5.0, clock.fn());
  ASSERT_TRUE(m.start_section("step").ok());
  std::atomic<int> calls{0};
  std::string section;
  m.start_watchdog(0.005, [&](const FtTimeoutEvent& e) {
    section = e.section;
    calls.fetch_add(1);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(calls.load(), 0);  // the clock stands still: 0 s open
  clock.set(101.5);
  // Generous: the watchdog checks every 5 ms; a loaded machine may delay it.
  for (int i = 0; i < 2000 && calls.load() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  m.stop_watchdog();
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(section, "step");
}

// ---- ft_state.json ----

TEST(FtState, JsonIsFtsStateDict) {
  FtSectionTimeouts t = configured(50, 10.5, std::nullopt, 300);
  EXPECT_EQ(ft_state_to_json(t).dump(), R"({"current_timeouts":{}})");  // nothing calculated
  t.calculated_sections = {"step", "setup"};
  EXPECT_EQ(ft_state_to_json(t).dump(),
            R"({"current_timeouts":{"section":{"calculated_sections":["setup","step"],"is_out_of_section_calculated":false,)"
            R"("out_of_section":300.0,"section":{"checkpointing":null,"setup":50.0,"step":10.5}}}})");
}

TEST(FtState, RoundTripAndErrors) {
  const fs::path dir = temp_dir("state");
  const std::string path = ft_state_path(dir.string());
  EXPECT_EQ(fs::path(path).filename(), "ft_state.json");
  StatusOr<std::optional<FtSectionTimeouts>> none = read_ft_state(path);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  FtSectionTimeouts t = configured(50, 10.5, std::nullopt, 80);
  t.calculated_sections = {"setup", "step"};
  t.is_out_of_section_calculated = true;
  ASSERT_TRUE(write_ft_state(path, t).ok());
  StatusOr<std::optional<FtSectionTimeouts>> back = read_ft_state(path);
  ASSERT_TRUE(back.ok()) << back.status().message();
  ASSERT_TRUE(back->has_value());
  EXPECT_EQ(**back, t);
  // Written by FT itself (Python's json.dump of RankMonitorClient.state_dict()).
  std::ofstream(path) << R"({"current_timeouts": {"section": {"section": {"setup": 600, "step": 12.5, )"
                         R"("checkpointing": 420}, "out_of_section": null, "calculated_sections": ["step"], )"
                         R"("is_out_of_section_calculated": false}}})";
  back = read_ft_state(path);
  ASSERT_TRUE(back.ok()) << back.status().message();
  FtSectionTimeouts ft = configured(600, 12.5, 420, std::nullopt);
  ft.calculated_sections = {"step"};
  EXPECT_EQ(**back, ft);
  std::ofstream(path) << R"({"current_timeouts": {"section": {"section": {"step": 1}}}})";
  EXPECT_NE(read_ft_state(path).status().message().find("ft_state.json: not a fault-tolerance state (no timeout for "
                                                         "section 'setup'"),
            std::string::npos);
  std::ofstream(path) << "{";
  EXPECT_NE(read_ft_state(path).status().message().find("not valid JSON"), std::string::npos);
  fs::remove_all(dir);
}

// ---- Megatron's integration on one process ----

FtArgs ft_args(bool calc) {
  FtArgs a;
  a.enable_ft_package = true;
  a.calc_ft_timeouts = calc;
  a.workload_check_interval = 3600;  // the watchdog never checks during the test
  a.num_warmup_iters = 1;            // core_v0.12.1's fixed warm-up (Megatron-LM main's default is 5)
  return a;
}

TEST(FtIntegration, SectionsFollowMegatron) {
  const fs::path dir = temp_dir("sections");
  FakeClock clock;
  StatusOr<std::unique_ptr<FtIntegration>> ft_or =
      FtIntegration::setup(ft_args(false), (dir / "save").string(), false, make_self_communicator(), clock.fn());
  ASSERT_TRUE(ft_or.ok()) << ft_or.status().message();
  FtIntegration& ft = *ft_or.value();
  EXPECT_TRUE(fs::is_directory(dir / "save"));  // created for the state
  FtRankMonitor& m = ft.monitor();
  // "setup" is open: 600 s allowed.
  EXPECT_FALSE(m.check(699).has_value());
  ASSERT_TRUE(m.check(701).has_value());
  EXPECT_EQ(m.check(701)->section, "setup");
  // The first training iteration is a warm-up: out of section, and no out-of-section timeout yet.
  clock.set(110);
  ft.on_training_step_start(1);
  EXPECT_FALSE(m.check(10000).has_value());
  clock.set(120);
  ft.on_training_step_end();
  // Once it has ended, the out-of-section timeout (300 s) counts from then.
  EXPECT_FALSE(m.check(419).has_value());
  ASSERT_TRUE(m.check(421).has_value());
  EXPECT_EQ(m.check(421)->section, "");
  // The second is inside "step" (180 s).
  clock.set(121);
  ft.on_training_step_start(2);
  EXPECT_FALSE(m.check(300).has_value());
  ASSERT_TRUE(m.check(302).has_value());
  EXPECT_EQ(m.check(302)->section, "step");
  clock.set(123);
  ft.on_training_step_end();
  // Evaluation: its first iteration out of section, the next ones inside "step".
  ft.on_eval_step_start();
  EXPECT_EQ(m.check(1000)->section, "");
  ft.on_eval_step_end();
  ft.on_eval_step_start();
  EXPECT_EQ(m.check(1000)->section, "step");
  ft.on_eval_step_end();
  // Saves are inside "checkpointing" (420 s).
  ft.on_checkpointing_start();
  EXPECT_FALSE(m.check(123 + 419).has_value());
  EXPECT_EQ(m.check(123 + 421)->section, "checkpointing");
  ASSERT_TRUE(ft.on_checkpointing_end(false).ok());
  EXPECT_EQ(ft.seen_training_iterations(), 2);
  EXPECT_DOUBLE_EQ(m.calc().section_max("setup"), 10.0);
  EXPECT_DOUBLE_EQ(m.calc().section_max("step"), 2.0);
  ASSERT_TRUE(ft.shutdown().ok());
  EXPECT_FALSE(fs::exists(dir / "save" / "ft_state.json"));  // no --calc-ft-timeouts
  fs::remove_all(dir);
}

// --ft-num-warmup-iters 3: iterations 1-3 run out of "step" with no timeout at all (their length does
// not matter), the 4th is the first inside "step"; each evaluation's first 3 iterations are out of it.
TEST(FtIntegration, WarmupIterationsFromTheFlag) {
  const fs::path dir = temp_dir("warmup");
  FakeClock clock;
  FtArgs args = ft_args(false);
  args.num_warmup_iters = 3;
  auto ft_or = FtIntegration::setup(args, (dir / "save").string(), false, make_self_communicator(), clock.fn());
  ASSERT_TRUE(ft_or.ok()) << ft_or.status().message();
  FtIntegration& ft = *ft_or.value();
  FtRankMonitor& m = ft.monitor();
  EXPECT_EQ(ft.num_warmup_iters(), 3);
  double t = 110;
  for (int i = 1; i <= 3; ++i) {  // slow warm-up iterations of 1000 s each, and 1000 s between them
    clock.set(t);
    ft.on_training_step_start(i);
    EXPECT_FALSE(m.check(t + 1000).has_value()) << "iteration " << i;
    clock.set(t + 1000);
    ft.on_training_step_end();
    if (i < 3) EXPECT_FALSE(m.check(t + 2000).has_value()) << "after iteration " << i;
    t += 2000;
  }
  // Warm-up over (at t - 1000): the out-of-section timeout counts from the end of iteration 3.
  const double end3 = t - 1000;
  EXPECT_FALSE(m.check(end3 + 299).has_value());
  ASSERT_TRUE(m.check(end3 + 301).has_value());
  EXPECT_EQ(m.check(end3 + 301)->section, "");
  clock.set(end3 + 1);
  ft.on_training_step_start(4);  // inside "step" (180 s)
  EXPECT_FALSE(m.check(end3 + 180).has_value());
  ASSERT_TRUE(m.check(end3 + 182).has_value());
  EXPECT_EQ(m.check(end3 + 182)->section, "step");
  clock.set(end3 + 2);
  ft.on_training_step_end();
  for (int e = 0; e < 4; ++e) {  // evaluation: the 4th iteration is the first inside "step"
    ft.on_eval_step_start();
    EXPECT_EQ(m.check(end3 + 5000)->section, e < 3 ? "" : "step") << "evaluation iteration " << e;
    ft.on_eval_step_end();
  }
  EXPECT_EQ(ft.seen_training_iterations(), 4);
  ASSERT_TRUE(ft.shutdown().ok());
  fs::remove_all(dir);
}

TEST(FtIntegration, WarmupFlagChecks) {
  FtArgs defaults;
  EXPECT_EQ(defaults.num_warmup_iters, 5);  // Megatron-LM main's default
  FakeClock clock;
  const fs::path dir = temp_dir("warmup0");
  FtArgs args = ft_args(false);
  args.num_warmup_iters = 0;  // no warm-up: the first iteration is inside "step", out-of-section watched at once
  auto ft = FtIntegration::setup(args, (dir / "save").string(), false, make_self_communicator(), clock.fn());
  ASSERT_TRUE(ft.ok());
  clock.set(110);
  ft.value()->on_training_step_start(1);
  EXPECT_EQ(ft.value()->monitor().check(110 + 181)->section, "step");
  ASSERT_TRUE(ft.value()->shutdown().ok());
  fs::remove_all(dir);
}

// A run of `iters` training iterations of 2 s with a save of 4 s at the end, from a fake clock that
// starts at 100 (setup lasts 10 s), then shutdown.
void fake_run(FtIntegration& ft, FakeClock& clock, int iters, bool loaded) {
  double t = 110;
  if (loaded) ft.on_checkpoint_loaded(false);
  for (int i = 1; i <= iters; ++i) {
    clock.set(t);
    ft.on_training_step_start(i);
    clock.set(t + 2);
    ft.on_training_step_end();
    t += 3;  // 1 s out of section between iterations
  }
  clock.set(t);
  ft.on_checkpointing_start();
  clock.set(t + 4);
  ASSERT_TRUE(ft.on_checkpointing_end(false).ok());
  clock.set(t + 6);  // 2 s out of section before the end
  ASSERT_TRUE(ft.shutdown().ok());
}

TEST(FtIntegration, CalculatedTimeoutsArePersistedAndResumed) {
  const fs::path dir = temp_dir("calc");
  const std::string save = (dir / "save").string();
  {  // A first run of 16 iterations: step and checkpointing calculated, setup not (nothing loaded).
    FakeClock clock;
    auto ft = FtIntegration::setup(ft_args(true), save, false, make_self_communicator(), clock.fn());
    ASSERT_TRUE(ft.ok());
    fake_run(*ft.value(), clock, 16, false);
    FtSectionTimeouts want = configured(600, 10, 20, 300);  // 5 × 2 s, 5 × 4 s
    want.calculated_sections = {"checkpointing", "step"};
    EXPECT_EQ(ft.value()->monitor().timeouts(), want);
    StatusOr<std::optional<FtSectionTimeouts>> stored = read_ft_state(ft_state_path(save));
    ASSERT_TRUE(stored.ok() && stored->has_value());
    EXPECT_EQ(**stored, want);
  }
  {  // The resumed run starts from the stored timeouts, then merges: 16 iterations of 2 s again;
     // setup (10 s, a checkpoint was loaded) and the out-of-section timeout now calculated too.
    FakeClock clock;
    auto ft = FtIntegration::setup(ft_args(true), save, false, make_self_communicator(), clock.fn());
    ASSERT_TRUE(ft.ok());
    EXPECT_EQ(ft.value()->monitor().timeouts().section.at("step"), 10.0);
    EXPECT_EQ(ft.value()->monitor().timeouts().section.at("checkpointing"), 20.0);
    fake_run(*ft.value(), clock, 16, true);
    const FtSectionTimeouts t = ft.value()->monitor().timeouts();
    EXPECT_EQ(t.section.at("setup"), 50.0);          // 5 × 10 s, calculated for the first time
    EXPECT_EQ(t.section.at("step"), 10.0);           // mean of 10 and 5 × 2
    EXPECT_EQ(t.section.at("checkpointing"), 20.0);  // mean of 20 and 5 × 4
    // Out of section, longest: from setup's end (110) through the warm-up iteration to iteration
    // 2's step (113): 3 s (the others: 1 s between iterations and before the save, 2 s at the end).
    EXPECT_EQ(t.out_of_section, 15.0);
    EXPECT_TRUE(t.is_out_of_section_calculated);
    StatusOr<std::optional<FtSectionTimeouts>> stored = read_ft_state(ft_state_path(save));
    ASSERT_TRUE(stored.ok() && stored->has_value());
    EXPECT_EQ(**stored, t);
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace gale
