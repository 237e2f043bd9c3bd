// run_interleaved / interleave_yield (core/interleave.h): the two computations alternate exactly at
// the yields, starting with the first; once one has ended the other runs on without switching;
// yields outside do nothing; each one's running time is reported; an exception comes back after
// both have finished; OpenMP regions and deep stacks work inside.
#include <gtest/gtest.h>

#include <array>
#include <ctime>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/interleave.h"
#include "core/threads.h"

namespace gale {
namespace {

TEST(Interleave, AlternatesAtEachYieldStartingWithTheFirst) {
  std::vector<std::string> log;
  const long long before = interleave_switches();
  EXPECT_FALSE(interleaving());
  run_interleaved(
      [&] {
        EXPECT_TRUE(interleaving());
        log.push_back("a0");
        interleave_yield();
        log.push_back("a1");
        interleave_yield();
        log.push_back("a2");
      },
      [&] {
        log.push_back("b0");
        interleave_yield();
        log.push_back("b1");
        interleave_yield();
        log.push_back("b2");
        interleave_yield();  // a has ended: runs on
        log.push_back("b3");
      });
  EXPECT_EQ(log, (std::vector<std::string>{"a0", "b0", "a1", "b1", "a2", "b2", "b3"}));
  EXPECT_EQ(interleave_switches() - before, 4);  // a0→b0, b0→a1, a1→b1, b1→a2 (b2's yield is a no-op)
  EXPECT_FALSE(interleaving());
}

TEST(Interleave, YieldOutsideDoesNothingAndOneSidedYieldsRunThrough) {
  interleave_yield();
  std::vector<int> log;
  run_interleaved([&] { log.push_back(1); }, [&] {
    log.push_back(2);
    interleave_yield();
    log.push_back(3);
  });
  EXPECT_EQ(log, (std::vector<int>{1, 2, 3}));
}

TEST(Interleave, ReportsEachOnesRunningTime) {
  auto spin = [](double seconds) {
    const double until = static_cast<double>(clock()) / CLOCKS_PER_SEC + seconds;
    while (static_cast<double>(clock()) / CLOCKS_PER_SEC < until) {
    }
  };
  const std::array<double, 2> s = run_interleaved(
      [&] {
        spin(0.02);
        interleave_yield();
        spin(0.02);
      },
      [&] { spin(0.005); });
  EXPECT_GT(s[0], 0.035);
  EXPECT_GT(s[1], 0.004);
  EXPECT_LT(s[1], s[0]);
}

TEST(Interleave, RethrowsAfterBothFinished) {
  bool b_finished = false;
  EXPECT_THROW(run_interleaved([] { throw std::runtime_error("a failed"); },
                               [&] {
                                 interleave_yield();
                                 b_finished = true;
                               }),
               std::runtime_error);
  EXPECT_TRUE(b_finished);
}

int depth(int n) {
  volatile char frame[4096];
  frame[0] = static_cast<char>(n);
  return n == 0 ? frame[0] : depth(n - 1) + 1;
}

TEST(Interleave, OpenMpAndDeepStacksInside) {
  std::vector<int64_t> sums(2, 0);
  auto work = [&](int which) {
    std::vector<int64_t> part(1000, 0);
    parallel_for(1000, 10, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) part[i] = i;
    });
    interleave_yield();
    for (int64_t v : part) sums[which] += v;
    EXPECT_EQ(depth(4000), 4000);  // ~16 MiB of frames
  };
  run_interleaved([&] { work(0); }, [&] { work(1); });
  EXPECT_EQ(sums[0], 499500);
  EXPECT_EQ(sums[1], 499500);
}

}  // namespace
}  // namespace gale
