// `gale pretrain` with Megatron's non-persistent checkpoints: a run stopped by --exit-interval
// after a non-persistent save resumes from it with exactly the uninterrupted run's losses (global
// on one process; local on two data-parallel ranks under mpirun, fully_parallel and atomic); the
// newest of the persistent and non-persistent checkpoints is loaded; older non-persistent
// checkpoints are removed; with --replication a rank's lost directory is restored from its replica,
// without it the load fails naming the missing file.
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "ckpt/temp_dir.h"
#include "cli/log_line.h"
#include "cli/mpi_cli.h"
#include "subprocess.h"

namespace gale {
namespace {

namespace fs = std::filesystem;
using testing::kMpiEnv;
using testing::logged_values;
using testing::tiny_gpt_pretrain;
using testing_util::read_bytes;
using testing_util::TempDir;

// The tiny GPT for `iters` iterations on `np` ranks (np 2: data-parallel size 2), log every iteration.
test::RunResult pretrain(int np, int iters, const std::vector<std::string>& extra) {
  return test::run_with_timeout(tiny_gpt_pretrain(np, iters, {"--log-interval", "1"}, extra), kMpiEnv, 300);
}

bool has(const std::string& output, const std::string& line) { return output.find(line) != std::string::npos; }

std::vector<double> tail(const std::vector<double>& v, size_t from) {
  return from <= v.size() ? std::vector<double>(v.begin() + static_cast<long>(from), v.end()) : std::vector<double>();
}

// Global: saves at 1, 2, 3 (each removing all but the newest before it writes), exit at 3 with no
// persistent save; the resumed run continues bit for bit.
TEST(NonPersistentCli, GlobalResumesExactlyAndKeepsOnlyTheNewest) {
  TempDir tmp;
  const std::string ckpt = tmp.file("ckpt"), np_dir = ckpt + "/non_persistent";
  test::RunResult whole = pretrain(1, 5, {});
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  const std::vector<double> losses = logged_values(whole.output, "lm loss");
  ASSERT_EQ(losses.size(), 5u) << whole.output;
  const std::vector<std::string> flags = {"--save", ckpt, "--save-interval", "100", "--non-persistent-save-interval",
                                          "1", "--non-persistent-ckpt-type", "global"};
  std::vector<std::string> first_flags = flags;
  first_flags.insert(first_flags.end(), {"--exit-interval", "3"});
  test::RunResult first = pretrain(1, 5, first_flags);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_TRUE(has(first.output, "saving checkpoint at iteration       3 to " + np_dir)) << first.output;
  EXPECT_TRUE(has(first.output, "Non-persistent checkpoints scheduled for removal: ['" + np_dir + "/iter_0000001']"))
      << first.output;
  EXPECT_TRUE(has(first.output, "Non-persistent checkpoints to be kept: ['" + np_dir + "/iter_0000002']"))
      << first.output;
  EXPECT_FALSE(fs::exists(np_dir + "/iter_0000001"));
  EXPECT_TRUE(fs::exists(np_dir + "/iter_0000002/metadata.json"));  // removed only before the next save
  EXPECT_TRUE(fs::exists(np_dir + "/iter_0000003/metadata.json"));
  EXPECT_EQ(read_bytes(np_dir + "/latest_checkpointed_iteration.txt"), "3");
  EXPECT_FALSE(fs::exists(ckpt + "/latest_checkpointed_iteration.txt"))
      << "the exit after a non-persistent save saves no persistent checkpoint";
  std::vector<std::string> resume_flags = flags;
  resume_flags.insert(resume_flags.end(), {"--load", ckpt});
  test::RunResult resumed = pretrain(1, 5, resume_flags);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(has(resumed.output, "Loading from a non-persistent checkpoint (non-persistent iter 3)")) << resumed.output;
  EXPECT_EQ(logged_values(resumed.output, "lm loss"), tail(losses, 3)) << resumed.output;
}

// Persistent saves at 2 and 4, a non-persistent one at 3: the load takes whichever is newer.
TEST(NonPersistentCli, LoadTakesTheNewestOfPersistentAndNonPersistent) {
  TempDir tmp;
  const std::string ckpt = tmp.file("ckpt"), np_dir = tmp.file("np");
  test::RunResult whole = pretrain(1, 5, {});
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  const std::vector<double> losses = logged_values(whole.output, "lm loss");
  ASSERT_EQ(losses.size(), 5u) << whole.output;
  const std::vector<std::string> flags = {"--save", ckpt, "--load", ckpt, "--save-interval", "2",
                                          "--non-persistent-save-interval", "3", "--non-persistent-ckpt-type",
                                          "global", "--non-persistent-global-ckpt-dir", np_dir};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> all = flags;
    all.insert(all.end(), extra.begin(), extra.end());
    return all;
  };
  test::RunResult first = pretrain(1, 5, with({"--exit-interval", "3"}));  // persistent 2, non-persistent 3
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_EQ(read_bytes(ckpt + "/latest_checkpointed_iteration.txt"), "2");
  EXPECT_EQ(read_bytes(np_dir + "/latest_checkpointed_iteration.txt"), "3");
  test::RunResult second = pretrain(1, 5, with({"--exit-interval", "4"}));  // from 3; persistent 4
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_TRUE(has(second.output, "Loading from a non-persistent checkpoint (non-persistent iter 3)")) << second.output;
  EXPECT_EQ(logged_values(second.output, "lm loss"), std::vector<double>{losses[3]}) << second.output;
  EXPECT_EQ(read_bytes(ckpt + "/latest_checkpointed_iteration.txt"), "4");
  test::RunResult third = pretrain(1, 5, with({}));  // from persistent 4
  ASSERT_EQ(third.exit_code, 0) << third.output;
  EXPECT_TRUE(has(third.output, "WARNING: non-persistent checkpoints are older than persistent checkpoint"))
      << third.output;
  EXPECT_TRUE(has(third.output, " loading checkpoint from " + ckpt + " at iteration 4")) << third.output;
  EXPECT_EQ(logged_values(third.output, "lm loss"), std::vector<double>{losses[4]}) << third.output;
}

// Local checkpoints at data-parallel size 2 under mpirun: saves at 1 and 2, exit at 2, resume.
void expect_local_resume(const std::vector<std::string>& layout, const std::string& algo) {
  TempDir tmp;
  const std::string ckpt = tmp.file("ckpt"), local = tmp.file("local");
  test::RunResult whole = pretrain(2, 4, layout);
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  const std::vector<double> losses = logged_values(whole.output, "lm loss");
  ASSERT_EQ(losses.size(), 4u) << whole.output;
  std::vector<std::string> flags = layout;
  flags.insert(flags.end(), {"--save", ckpt, "--load", ckpt, "--save-interval", "100", "--non-persistent-save-interval",
                             "1", "--non-persistent-ckpt-type", "local", "--non-persistent-local-ckpt-dir", local,
                             "--non-persistent-local-ckpt-algo", algo});
  std::vector<std::string> first_flags = flags;
  first_flags.insert(first_flags.end(), {"--exit-interval", "2"});
  test::RunResult first = pretrain(2, 4, first_flags);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_TRUE(has(first.output, "  successfully saved local checkpoint from iteration       2")) << first.output;
  for (int rank : {0, 1}) {
    const std::string dir = local + "/" + std::to_string(rank) + "/";
    EXPECT_TRUE(fs::exists(dir + "iter_0000002_" + std::to_string(rank) + "_local.safetensors")) << dir;
    EXPECT_FALSE(fs::exists(dir + "iter_0000001_" + std::to_string(rank) + "_local.safetensors"))
        << dir << ": the older part is removed after the save";
  }
  EXPECT_FALSE(fs::exists(ckpt + "/latest_checkpointed_iteration.txt"));
  test::RunResult resumed = pretrain(2, 4, flags);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(has(resumed.output, "Loading from a non-persistent checkpoint (non-persistent iter 2)")) << resumed.output;
  EXPECT_TRUE(has(resumed.output, "  successfully loaded checkpoint from " + local + " at iteration 2")) << resumed.output;
  EXPECT_EQ(logged_values(resumed.output, "lm loss"), tail(losses, 2)) << resumed.output;
  // One process finds rank 0's parts of a two-rank save: refused, naming the world sizes.
  test::RunResult one = pretrain(1, 4, flags);
  EXPECT_NE(one.exit_code, 0) << one.output;
  EXPECT_TRUE(has(one.output, "was saved by 2 ranks; this run has 1")) << one.output;
}

// fully_parallel: rank 1's part holds nothing (plain data parallelism writes one copy, from rank 0);
// the load gives rank 1 rank 0's part.
TEST(NonPersistentCli, LocalFullyParallelResumesExactlyAtDataParallel2) { expect_local_resume({}, "fully_parallel"); }

// atomic with the distributed optimizer: each rank's part holds the parameters and its own shard of
// the optimizer state, and each rank reads back only its own part.
TEST(NonPersistentCli, LocalAtomicResumesExactlyWithTheDistributedOptimizer) {
  expect_local_resume({"--use-distributed-optimizer"}, "atomic");
}

// --replication (jump 1, factor 2: ranks 0 and 1 form a clique): each rank's directory holds both
// parts; deleting rank 1's directory (a lost node) still resumes exactly. Without replication the
// same loss is an error naming the missing part.
TEST(NonPersistentCli, ReplicationRestoresALostRankDirectory) {
  TempDir tmp;
  test::RunResult whole = pretrain(2, 3, {"--use-distributed-optimizer"});
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  const std::vector<double> losses = logged_values(whole.output, "lm loss");
  ASSERT_EQ(losses.size(), 3u) << whole.output;
  for (bool replication : {true, false}) {
    const std::string ckpt = tmp.file(replication ? "ckpt_r" : "ckpt"), local = tmp.file(replication ? "local_r" : "local");
    std::vector<std::string> flags = {"--use-distributed-optimizer", "--save", ckpt, "--load", ckpt,
                                      "--save-interval", "100", "--non-persistent-save-interval", "2",
                                      "--non-persistent-ckpt-type", "local", "--non-persistent-local-ckpt-dir", local};
    if (replication) flags.insert(flags.end(), {"--replication", "--replication-jump", "1", "--replication-factor", "2"});
    std::vector<std::string> first_flags = flags;
    first_flags.insert(first_flags.end(), {"--exit-interval", "2"});
    test::RunResult first = pretrain(2, 3, first_flags);
    ASSERT_EQ(first.exit_code, 0) << first.output;
    EXPECT_EQ(fs::exists(local + "/0/iter_0000002_1_local.safetensors"), replication);
    EXPECT_EQ(fs::exists(local + "/1/iter_0000002_0_local.safetensors"), replication);
    fs::remove_all(local + "/1");
    test::RunResult resumed = pretrain(2, 3, flags);
    if (replication) {
      ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
      EXPECT_TRUE(has(resumed.output, "Loading from a non-persistent checkpoint (non-persistent iter 2)"))
          << resumed.output;
      EXPECT_EQ(logged_values(resumed.output, "lm loss"), tail(losses, 2)) << resumed.output;
    } else {
      EXPECT_NE(resumed.exit_code, 0) << resumed.output;
      EXPECT_TRUE(has(resumed.output, "the local checkpoint of iteration 2 in " + local + " is incomplete: " + local +
                                          "/1/iter_0000002_1_local.safetensors does not exist and no rank holds a "
                                          "replica of it"))
          << resumed.output;
    }
  }
}

}  // namespace
}  // namespace gale
