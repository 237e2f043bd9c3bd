// `gale pretrain --exit-signal-handler`: SIGTERM to the process (or to one rank of two under mpirun)
// ends the run after the current iteration with a checkpoint and exit code 0, every rank at the
// same iteration, and `--load` continues from it; without the flag SIGTERM still terminates.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "cli/mpi_cli.h"
#include "subprocess.h"

namespace gale {
namespace {

using testing::kMpiEnv;
using testing::launch_argv;

const std::string kModel =
    "pretrain --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 "
    "--max-position-embeddings 16 --micro-batch-size 1 --global-batch-size 2 --lr 1e-3 --mock-data "
    "--vocab-size 4096 --eval-iters 0 --num-threads 1 --log-interval 1";

// kModel resumed from `ckpt` for `iters` iterations, on `np` ranks (np > 1: under mpirun).
std::vector<std::string> resume_argv(int np, int iters, const std::string& ckpt) {
  std::vector<std::string> program = {GALE_BINARY};
  std::istringstream words(kModel);
  for (std::string w; words >> w;) program.push_back(w);
  return launch_argv(np, program, {"--train-iters", std::to_string(iters), "--load", ckpt});
}

struct Scratch {
  std::filesystem::path dir;
  explicit Scratch(const std::string& name)
      : dir(std::filesystem::temp_directory_path() / ("gale_exit_signal_" + name + "_" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  ~Scratch() { std::filesystem::remove_all(dir); }
};

// Starts `launch` in the background, waits until its log shows iteration 3, sends SIGTERM to the
// process `victim` names (a shell expression over $pid, the background job), waits for the job and
// prints "exit=<status>" after its log.
test::RunResult terminate_during_training(const std::string& launch, const std::string& victim, const Scratch& s) {
  const std::string log = (s.dir / "log").string();
  const std::string script = launch + " >" + log + " 2>&1 & pid=$!\n" +
                             "for i in $(seq 1200); do grep -q 'iteration  *3/' " + log +
                             " && break; kill -0 $pid 2>/dev/null || break; sleep 0.1; done\n"
                             "kill -TERM " + victim + "\n"
                             "wait $pid; status=$?\ncat " + log + "\necho \"exit=$status\"\n";
  return test::run_with_timeout({"bash", "-c", script}, kMpiEnv, 240);
}

int last_iteration(const std::string& output) {
  int last = 0;
  std::regex re(R"(iteration +(\d+)/)");
  for (std::sregex_iterator it(output.begin(), output.end(), re), end; it != end; ++it) last = std::stoi((*it)[1]);
  return last;
}

TEST(ExitSignalCli, SigtermSavesAndExitsCleanlyThenResumes) {
  Scratch s("one");
  const std::string ckpt = (s.dir / "ckpt").string();
  const std::string run = std::string(GALE_BINARY) + " " + kModel + " --train-iters 100000 --exit-signal-handler --save-interval 100000 --save " + ckpt;
  test::RunResult r = terminate_during_training(run, "$pid", s);
  ASSERT_FALSE(r.timed_out) << r.output;
  EXPECT_NE(r.output.find("exit=0"), std::string::npos) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex(R"(\[exiting program after receiving SIGTERM\.\] datetime: \d{4}-)")))
      << r.output;
  const int stopped = last_iteration(r.output);
  ASSERT_GE(stopped, 3);
  EXPECT_LT(stopped, 1000);
  // The checkpoint holds the last iteration, and a resumed run continues right after it.
  test::RunResult resumed = test::run_with_timeout(resume_argv(1, stopped + 1, ckpt), {}, 240);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("at iteration " + std::to_string(stopped)), std::string::npos) << resumed.output;
  EXPECT_EQ(last_iteration(resumed.output), stopped + 1) << resumed.output;
}

TEST(ExitSignalCli, WithoutTheFlagSigtermTerminates) {
  Scratch s("off");
  const std::string run = std::string(GALE_BINARY) + " " + kModel + " --train-iters 100000 --save-interval 100000 --save " + (s.dir / "ckpt").string();
  test::RunResult r = terminate_during_training(run, "$pid", s);
  ASSERT_FALSE(r.timed_out) << r.output;
  EXPECT_NE(r.output.find("exit=143"), std::string::npos) << r.output;  // 128 + SIGTERM
  EXPECT_EQ(r.output.find("exiting program"), std::string::npos) << r.output;
}

// Two data-parallel ranks; only one receives SIGTERM. Both stop after the same iteration (no hang,
// no rank left waiting in a collective), mpirun exits 0, and the checkpoint loads.
TEST(ExitSignalCli, OneRankSignalledStopsEveryRank) {
  Scratch s("mpi");
  const std::string ckpt = (s.dir / "ckpt").string();
  const std::string run = std::string(GALE_MPIEXEC) + " --oversubscribe --bind-to none -np 2 " + GALE_BINARY + " " +
                          kModel + " --train-iters 100000 --exit-signal-handler --save-interval 100000 --save " + ckpt;
  // The first gale rank started by mpirun (its child).
  test::RunResult r = terminate_during_training(run, "$(pgrep -P $pid -x gale | head -1)", s);
  ASSERT_FALSE(r.timed_out) << r.output;
  EXPECT_NE(r.output.find("exit=0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[exiting program after receiving SIGTERM.]"), std::string::npos) << r.output;
  const int stopped = last_iteration(r.output);
  ASSERT_GE(stopped, 3);
  test::RunResult resumed = test::run_with_timeout(resume_argv(2, stopped + 1, ckpt), kMpiEnv, 240);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_EQ(last_iteration(resumed.output), stopped + 1) << resumed.output;
}

}  // namespace
}  // namespace gale
