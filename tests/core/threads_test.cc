// Tests for core/threads.h: parallel_for coverage and the per-process thread default under launchers.
#include "core/threads.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <vector>

namespace gale {
namespace {

TEST(ParallelFor, CoversEveryIndexOnce) {
  for (int64_t n : {0, 1, 7, 1000, 12345}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    parallel_for(n, 16, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "n=" << n << " i=" << i;
  }
}

class LauncherEnv : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kVars) unsetenv(v);
  }
  void TearDown() override {
    for (const char* v : kVars) unsetenv(v);
  }
  static constexpr const char* kVars[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"};
};

TEST_F(LauncherEnv, NoLauncherMeansOneProcessUsingAllCores) {
  EXPECT_EQ(local_process_count(), 1);
  EXPECT_EQ(default_threads_per_process(), available_cores());
}

TEST_F(LauncherEnv, CoresAreSharedBetweenLocalRanks) {
  int cores = available_cores();
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
  EXPECT_EQ(local_process_count(), 2);
  EXPECT_EQ(default_threads_per_process(), std::max(1, cores / 2));
  unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  setenv("SLURM_NTASKS_PER_NODE", "4(x2)", 1);
  EXPECT_EQ(local_process_count(), 4);
  setenv("MPI_LOCALNRANKS", "1000", 1);  // more ranks than cores: still one thread each
  EXPECT_EQ(local_process_count(), 1000);
  EXPECT_EQ(default_threads_per_process(), 1);
}

TEST_F(LauncherEnv, GarbageFallsBackToOne) {
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "abc", 1);
  EXPECT_EQ(local_process_count(), 1);
}

}  // namespace
}  // namespace gale
