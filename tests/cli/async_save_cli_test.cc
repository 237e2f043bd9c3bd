// `gale pretrain --async-save` (and --ckpt-format): checkpoints written by background threads are
// byte-identical to synchronous ones, on one process and on two ranks under mpirun; a run resumed
// from one reproduces the uninterrupted run's losses; Megatron's log lines; bad values are refused.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
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
using testing::launch_argv;
using testing::logged_values;
using testing_util::read_bytes;
using testing_util::TempDir;

const std::string kModel =
    "pretrain --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 "
    "--max-position-embeddings 16 --micro-batch-size 1 --global-batch-size 2 --lr 1e-3 --mock-data "
    "--vocab-size 4096 --eval-iters 0 --num-threads 1 --log-interval 1";

// `gale` kModel `extra` on `np` ranks (np > 1: under mpirun).
test::RunResult pretrain(int np, const std::vector<std::string>& extra) {
  std::vector<std::string> program = {GALE_BINARY};
  std::istringstream words(kModel);
  for (std::string w; words >> w;) program.push_back(w);
  return test::run_with_timeout(launch_argv(np, program, extra), kMpiEnv, 300);
}

// Every file under `dir` (relative path -> bytes).
std::map<std::string, std::string> tree(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const fs::directory_entry& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) files[fs::relative(e.path(), dir).string()] = read_bytes(e.path().string());
  return files;
}

// Saves at iterations 2 and 4, synchronously and with --async-save: the same files, byte for byte.
void expect_same_checkpoints(int np, const std::vector<std::string>& layout) {
  TempDir tmp;
  const std::string sync_dir = tmp.file("sync"), async_dir = tmp.file("async");
  std::vector<std::string> flags = layout;
  for (const char* f : {"--train-iters", "4", "--save-interval", "2"}) flags.push_back(f);
  std::vector<std::string> sync_flags = flags, async_flags = flags;
  sync_flags.insert(sync_flags.end(), {"--save", sync_dir});
  async_flags.insert(async_flags.end(), {"--save", async_dir, "--async-save", "--ckpt-format", "torch_dist"});
  test::RunResult sync_run = pretrain(np, sync_flags);
  ASSERT_EQ(sync_run.exit_code, 0) << sync_run.output;
  test::RunResult async_run = pretrain(np, async_flags);
  ASSERT_EQ(async_run.exit_code, 0) << async_run.output;
  for (const char* line : {"  scheduled an async checkpoint save at iteration       2 to ",
                           "  scheduled an async checkpoint save at iteration       4 to ",
                           "  successfully saved checkpoint at iteration       2 to ",
                           "  successfully saved checkpoint at iteration       4 to "})
    EXPECT_NE(async_run.output.find(line), std::string::npos) << line << "\n" << async_run.output;
  EXPECT_EQ(sync_run.output.find("scheduled an async"), std::string::npos);
  // The same losses: the snapshot does not disturb training.
  EXPECT_EQ(logged_values(async_run.output, "lm loss"), logged_values(sync_run.output, "lm loss"));
  const std::map<std::string, std::string> expected = tree(sync_dir), found = tree(async_dir);
  EXPECT_TRUE(expected.count("iter_0000002/metadata.json") && expected.count("iter_0000004/metadata.json"));
  EXPECT_EQ(expected.count("iter_0000002/shard_00001.safetensors"), np > 1 ? 1u : 0u);
  ASSERT_EQ(found.size(), expected.size());
  for (const auto& [name, bytes] : expected) {
    ASSERT_TRUE(found.count(name)) << name;
    EXPECT_TRUE(found.at(name) == bytes) << name << " differs";
  }
  EXPECT_EQ(read_bytes(async_dir + "/latest_checkpointed_iteration.txt"), "4");
}

TEST(AsyncSaveCli, CheckpointsAreByteIdenticalToSynchronousOnes) { expect_same_checkpoints(1, {}); }

// Two data-parallel ranks with the distributed optimizer: both write a shard in the background.
TEST(AsyncSaveCli, TwoRanksUnderMpirunWriteTheSameCheckpoints) {
  expect_same_checkpoints(2, {"--use-distributed-optimizer"});
}

// --exit-interval 3 with --async-save: the exit finalises the save (tracker written), and a run
// resumed from it continues with exactly the losses of an uninterrupted run.
TEST(AsyncSaveCli, ResumedRunReproducesTheUninterruptedLosses) {
  TempDir tmp;
  const std::string ckpt = tmp.file("ckpt");
  test::RunResult whole = pretrain(1, {"--train-iters", "6"});
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  const std::vector<double> losses = logged_values(whole.output, "lm loss");
  ASSERT_EQ(losses.size(), 6u) << whole.output;
  test::RunResult first = pretrain(1, {"--train-iters", "6", "--save", ckpt, "--save-interval", "3", "--exit-interval",
                                       "3", "--async-save"});
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const size_t exiting = first.output.find("exiting program at iteration 3");
  const size_t saved = first.output.find("  successfully saved checkpoint at iteration       3 to ");
  ASSERT_NE(exiting, std::string::npos) << first.output;
  ASSERT_NE(saved, std::string::npos) << first.output;
  EXPECT_LT(first.output.find("scheduled an async checkpoint save at iteration       3"), exiting) << first.output;
  EXPECT_EQ(read_bytes(ckpt + "/latest_checkpointed_iteration.txt"), "3");
  test::RunResult resumed = pretrain(1, {"--train-iters", "6", "--load", ckpt, "--save", ckpt, "--save-interval", "3",
                                         "--async-save"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_EQ(logged_values(resumed.output, "lm loss"), std::vector<double>(losses.begin() + 3, losses.end()))
      << resumed.output;
  EXPECT_EQ(read_bytes(ckpt + "/latest_checkpointed_iteration.txt"), "6");
}

TEST(AsyncSaveCli, CkptFormatIsANoteAndBadValuesAreRefused) {
  test::RunResult noted = pretrain(1, {"--train-iters", "1", "--ckpt-format", "torch"});
  ASSERT_EQ(noted.exit_code, 0) << noted.output;
  EXPECT_NE(noted.output.find("accepted without effect: --ckpt-format torch: Gale always writes its own"),
            std::string::npos)
      << noted.output;
  test::RunResult bad = pretrain(1, {"--train-iters", "1", "--ckpt-format", "torch_distributed"});
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("gale pretrain: error: --ckpt-format: expected one of torch, torch_dist, zarr, torch_dcp, "
                            "fsdp_dtensor, found 'torch_distributed'"),
            std::string::npos)
      << bad.output;
  test::RunResult legacy = pretrain(1, {"--train-iters", "1", "--async-save", "--ckpt-format", "torch"});
  EXPECT_EQ(legacy.exit_code, 2) << legacy.output;
  EXPECT_NE(legacy.output.find("--async-save needs --ckpt-format torch_dist"), std::string::npos) << legacy.output;
}

}  // namespace
}  // namespace gale
