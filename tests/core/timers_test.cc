// Megatron's timers: log levels (timers above --timing-log-level are never created), start/stop
// accumulation, elapsed with and without reset, and the across-ranks report strings against
// Megatron's own timers.py (tools/reference/timers_reference.py).
#include "core/timers.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace gale {
namespace {

void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

TEST(Timers, TimersAboveTheLogLevelAreDummies) {
  Timers timers(1, TimingLogOption::kMinMax);
  Timer& detailed = timers("forward-compute", 2);
  EXPECT_FALSE(detailed.enabled());
  detailed.start();
  detailed.start();  // a dummy ignores everything: no "already started" check
  detailed.stop();
  EXPECT_FALSE(timers.has("forward-compute"));
  EXPECT_EQ(&timers("backward-compute", 2), &detailed);  // one shared dummy
  EXPECT_TRUE(timers("forward-backward", 1).enabled());
  EXPECT_TRUE(timers("save-checkpoint", 0).enabled());
  EXPECT_TRUE(timers.has("forward-backward"));
  EXPECT_TRUE(timers.has("save-checkpoint"));
  // A name without a timer reads as 0, like a dummy's name in Megatron's report.
  EXPECT_EQ(timers.elapsed({"forward-compute", "nothing"}, true), (std::vector<double>{0.0, 0.0}));
  Timers level0(0, TimingLogOption::kMax);
  EXPECT_FALSE(level0("forward-backward", 1).enabled());
  EXPECT_TRUE(level0("load-checkpoint", 0).enabled());
}

TEST(Timers, AccumulatesUntilReadWithReset) {
  Timers timers(2, TimingLogOption::kMinMax);
  Timer& t = timers("optimizer", 1);
  EXPECT_EQ(t.elapsed(), 0.0);
  t.start();
  sleep_ms(20);
  t.stop();
  sleep_ms(30);  // not running: not counted
  t.start();
  sleep_ms(20);
  t.stop();
  const double kept = t.elapsed(/*reset=*/false);
  EXPECT_GE(kept, 0.040);
  EXPECT_LT(kept, 0.070);
  EXPECT_EQ(t.elapsed(/*reset=*/true), kept);  // not reset by the first read
  EXPECT_EQ(t.elapsed(), 0.0);                 // reset by the second
  EXPECT_GE(t.active_time(), kept);            // active time survives resets
  // A running timer is read up to now and keeps running.
  t.start();
  sleep_ms(20);
  const double partial = t.elapsed();
  EXPECT_GE(partial, 0.020);
  EXPECT_TRUE(t.started());
  sleep_ms(20);
  t.stop();
  const double rest = t.elapsed();
  EXPECT_GE(rest, 0.020);
  EXPECT_LT(rest, partial + 0.040);  // the part before the first read is not counted twice
  t.set_elapsed(1.5);
  EXPECT_EQ(timers.elapsed({"optimizer"}, /*reset=*/true), std::vector<double>{1.5});
  EXPECT_EQ(t.elapsed(), 0.0);
}

TEST(Timers, BarrierOnlyWhenAsked) {
  Timers timers(1, TimingLogOption::kMinMax);
  int barriers = 0;
  timers.set_barrier([&] { ++barriers; });
  timers("a", 1).start(/*barrier=*/true);
  timers("a", 1).stop();
  EXPECT_EQ(barriers, 1);
  { ScopedTimer s = ScopedTimer::level1(&timers, "b"); }
  EXPECT_EQ(barriers, 2);
  timers.set_barrier_with_level1(false);  // --no-barrier-with-level-1-timing
  { ScopedTimer s = ScopedTimer::level1(&timers, "b"); }
  { ScopedTimer s(&timers, "c", 2, /*barrier=*/true); }  // above the level: no barrier either
  EXPECT_EQ(barriers, 2);
  EXPECT_TRUE(timers.has("b"));
  EXPECT_FALSE(timers.has("c"));
}

TEST(Timers, ScopedTimerStopsOnceAndAcceptsNoTimers) {
  Timers timers(2, TimingLogOption::kMinMax);
  {
    ScopedTimer s(&timers, "forward-compute", 2);
    EXPECT_TRUE(timers("forward-compute", 2).started());
    s.stop();
    EXPECT_FALSE(timers("forward-compute", 2).started());
  }  // the destructor's stop is a no-op after stop()
  ScopedTimer none(nullptr, "forward-compute", 2);
  none.stop();
  EXPECT_GT(timers("forward-compute", 2).elapsed(), 0.0);
}

TEST(Timers, ParsesTheLogOption) {
  EXPECT_EQ(parse_timing_log_option("max"), TimingLogOption::kMax);
  EXPECT_EQ(parse_timing_log_option("minmax"), TimingLogOption::kMinMax);
  EXPECT_EQ(parse_timing_log_option("all"), TimingLogOption::kAll);
  EXPECT_FALSE(parse_timing_log_option("min").has_value());
}

// tools/reference/timers_reference.py's matrix: 3 ranks, seconds, normalised by --log-interval 2.
GatheredTimes reference_times() {
  GatheredTimes g;
  g.names = {"forward-backward", "forward-recv", "a-timer-name-longer-than-forty-seven-characters-x", "never-ran"};
  g.world_size = 3;
  g.times = {0.5f, 0.0f, 0.001f, 0.0f,  //
             0.75f, 0.125f, 0.002f, 0.0f,  //
             0.6251f, 0.25f, 0.0035f, 0.0f};
  return g;
}

TEST(Timers, ReportsMinMaxAsMegatron) {
  EXPECT_EQ(format_timers(TimingLogOption::kMinMax, reference_times(), 2.0).value(),
            "(min, max) time across ranks (ms):\n"
            "    forward-backward ...............................: (250.00, 375.00)\n"
            "    forward-recv ...................................: (62.50, 125.00)\n"
            "    a-timer-name-longer-than-forty-seven-characters-x : (0.50, 1.75)");
}

TEST(Timers, ReportsMaxAsMegatron) {
  EXPECT_EQ(format_timers(TimingLogOption::kMax, reference_times(), 2.0).value(),
            "max time across ranks (ms):\n"
            "    forward-backward ...............................: 375.00\n"
            "    forward-recv ...................................: 125.00\n"
            "    a-timer-name-longer-than-forty-seven-characters-x : 1.75");
}

TEST(Timers, ReportsAllRanksAsMegatron) {
  EXPECT_EQ(format_timers(TimingLogOption::kAll, reference_times(), 2.0).value(),
            "times across ranks (ms):\n"
            "  forward-backward:\n"
            "     rank  0: 250.00\n"
            "     rank  1: 375.00\n"
            "     rank  2: 312.55\n"
            "  forward-recv:\n"
            "     rank  1: 62.50\n"
            "     rank  2: 125.00\n"
            "  a-timer-name-longer-than-forty-seven-characters-x:\n"
            "     rank  0: 0.50\n"
            "     rank  1: 1.00\n"
            "     rank  2: 1.75");
}

TEST(Timers, MinMaxForTensorBoardInSeconds) {
  // Megatron's Timers.write: the max across ranks, normalised, in seconds.
  const std::vector<TimerMinMax> mm = timers_min_max(reference_times(), 2.0);
  ASSERT_EQ(mm.size(), 3u);
  EXPECT_EQ(mm[0].name, "forward-backward");
  EXPECT_DOUBLE_EQ(mm[0].min, 0.25);
  EXPECT_DOUBLE_EQ(mm[0].max, 0.375);
  EXPECT_EQ(mm[1].name, "forward-recv");
  EXPECT_DOUBLE_EQ(mm[1].min, 0.0625);  // rank 0 has no such timer: left out of the minimum
  EXPECT_DOUBLE_EQ(mm[1].max, 0.125);
  EXPECT_DOUBLE_EQ(mm[2].max, 0.0017500000540167093);  // the reference's value (float32 seconds)
}

TEST(Timers, NothingToReportWhenNoTimerRan) {
  GatheredTimes g;
  g.names = {"forward-backward"};
  g.world_size = 2;
  g.times = {0.0f, 0.0f};
  for (TimingLogOption o : {TimingLogOption::kMinMax, TimingLogOption::kMax, TimingLogOption::kAll})
    EXPECT_FALSE(format_timers(o, g, 1.0).has_value());
  EXPECT_FALSE(format_timers(TimingLogOption::kMinMax, GatheredTimes{}, 1.0).has_value());
}

}  // namespace
}  // namespace gale
