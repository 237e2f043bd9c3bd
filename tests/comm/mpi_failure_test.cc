// Failure behaviour of a multi-rank job: whatever one rank does wrong (a failed CHECK, a
// fatal_exit, SIGKILL, a hang, an MPI error), mpirun ends non-zero quickly and no rank is left
// running. Starts `mpirun -np 4` on tests/comm/mpi_failure_helper.cc with a time limit.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "cli/mpi_cli.h"
#include "subprocess.h"

namespace gale {
namespace {

namespace fs = std::filesystem;

constexpr int kRanks = 4;

struct JobResult {
  test::RunResult run;
  std::vector<int> pids;  // of the ranks that started
};

// Runs the helper under mpirun, then checks that every rank that started is gone.
JobResult run_job(const std::string& scenario, int victim, double limit_seconds, const std::string& timeout = "") {
  fs::path dir = fs::temp_directory_path() / ("gale_failure_" + std::to_string(getpid()) + "_" + scenario);
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::vector<std::string> argv = {
      GALE_MPIEXEC, "--oversubscribe",      "--bind-to", "none", "-np", std::to_string(kRanks), GALE_MPI_FAILURE_HELPER,
      scenario,     std::to_string(victim), dir.string()};
  if (!timeout.empty()) argv.push_back(timeout);
  JobResult job;
  job.run = test::run_with_timeout(argv, testing::kMpiEnv, limit_seconds);
  for (int r = 0; r < kRanks; ++r) {
    std::ifstream in(dir / (std::to_string(r) + ".pid"));
    int pid = 0;
    if (in >> pid) job.pids.push_back(pid);
  }
  fs::remove_all(dir);
  return job;
}

// Every rank process has exited (allowing a moment for the last ones to be reaped).
::testing::AssertionResult all_ranks_gone(const JobResult& job) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (int pid : job.pids) {
    while (test::process_alive(pid)) {
      if (std::chrono::steady_clock::now() > deadline)
        return ::testing::AssertionFailure() << "rank process " << pid << " is still running";
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(MpiFailure, NormalRunExitsZeroAfterFinalize) {
  JobResult job = run_job("normal", -1, 60);
  ASSERT_FALSE(job.run.timed_out) << job.run.output;
  EXPECT_EQ(job.run.exit_code, 0) << job.run.output;
  EXPECT_NE(job.run.output.find("all 4 ranks finished"), std::string::npos) << job.run.output;
  EXPECT_EQ(job.pids.size(), static_cast<size_t>(kRanks));
  EXPECT_TRUE(all_ranks_gone(job));
}

TEST(MpiFailure, FailedCheckOnOneRankStopsEveryRank) {
  JobResult job = run_job("check-fail", 2, 60);
  ASSERT_FALSE(job.run.timed_out) << "the job hung after a failed CHECK:\n" << job.run.output;
  EXPECT_EQ(job.run.exit_code, 134) << job.run.output;  // kCheckFailureExitCode through MPI_Abort
  EXPECT_LT(job.run.seconds, 30.0);
  EXPECT_NE(job.run.output.find("CHECK failed"), std::string::npos) << job.run.output;
  EXPECT_NE(job.run.output.find("rank 2 fails on purpose"), std::string::npos) << job.run.output;
  EXPECT_TRUE(all_ranks_gone(job));
}

TEST(MpiFailure, FatalExitOnOneRankEndsTheJobWithItsCode) {
  JobResult job = run_job("fatal-exit", 1, 60);
  ASSERT_FALSE(job.run.timed_out) << job.run.output;
  EXPECT_EQ(job.run.exit_code, 3) << job.run.output;
  EXPECT_NE(job.run.output.find("exit code 3"), std::string::npos) << job.run.output;
  EXPECT_TRUE(all_ranks_gone(job));
}

TEST(MpiFailure, RankKilledMidStepBringsTheJobDownWithin60Seconds) {
  JobResult job = run_job("sigkill", 1, 90);
  ASSERT_FALSE(job.run.timed_out) << "the job outlived a SIGKILLed rank:\n" << job.run.output;
  EXPECT_NE(job.run.exit_code, 0) << job.run.output;
  EXPECT_LT(job.run.seconds, 60.0);
  EXPECT_TRUE(all_ranks_gone(job));
}

TEST(MpiFailure, HungRankIsCaughtByTheTimeout) {
  JobResult job = run_job("hang", 3, 60, /*timeout=*/"2");
  ASSERT_FALSE(job.run.timed_out) << "the watchdog did not end the job:\n" << job.run.output;
  EXPECT_NE(job.run.exit_code, 0) << job.run.output;
  EXPECT_NE(job.run.output.find("has not completed after"), std::string::npos) << job.run.output;
  EXPECT_NE(job.run.output.find("all_reduce"), std::string::npos) << job.run.output;
  EXPECT_TRUE(all_ranks_gone(job));
}

TEST(MpiFailure, MpiErrorIsReportedAndAbortsTheJob) {
  JobResult job = run_job("truncate", 1, 60);
  ASSERT_FALSE(job.run.timed_out) << job.run.output;
  EXPECT_NE(job.run.exit_code, 0) << job.run.output;
  EXPECT_NE(job.run.output.find("MPI error in recv from rank 0"), std::string::npos) << job.run.output;
  EXPECT_TRUE(all_ranks_gone(job));
}

TEST(MpiFailure, EveryRankExitingNonZeroEndsTheJobNonZero) {
  JobResult job = run_job("exit-all", -1, 60);
  ASSERT_FALSE(job.run.timed_out) << job.run.output;
  EXPECT_EQ(job.run.exit_code, 2) << job.run.output;
  EXPECT_TRUE(all_ranks_gone(job));
}

}  // namespace
}  // namespace gale
