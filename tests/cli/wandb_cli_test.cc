// `gale pretrain --wandb-project`: the last rank alone writes a W&B offline run whose history rows
// hold the values the log lines print, its config names the flags, it ends with exit code 0; the
// default directory is {--save}/wandb; Megatron's validation errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <regex>

#include "cli/log_line.h"
#include "cli/mpi_cli.h"
#include "subprocess.h"
#include "testing_wandb.h"

namespace gale {
namespace {

namespace fs = std::filesystem;
using testing::kMpiEnv;
using testing::launch_argv;

// A tiny GPT for 4 iterations of 4 samples, validation every 2 iterations.
std::vector<std::string> tiny(int np, std::vector<std::string> extra) {
  const std::vector<std::string> pretrain = {
      GALE_BINARY, "pretrain", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
      "--seq-length", "32", "--max-position-embeddings", "32", "--micro-batch-size", "2", "--global-batch-size", "4",
      "--train-iters", "4", "--lr", "3e-3", "--mock-data", "--vocab-size", "4096", "--log-interval", "1",
      "--eval-interval", "2", "--eval-iters", "1", "--num-threads", "1"};
  return launch_argv(np, pretrain, extra);
}

std::string fresh_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + name + "_" + std::to_string(getpid());
  fs::remove_all(dir);
  return dir;
}

std::vector<std::string> run_files(const std::string& dir) {
  std::vector<std::string> found;
  if (!fs::exists(dir)) return found;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file() && e.path().extension() == ".wandb") found.push_back(e.path().string());
  return found;
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

// Pipeline-parallel over 2 processes: the last rank (the second stage, which prints the log line)
// writes the one run; every history value equals the log's (printed with 6 significant digits).
TEST(GaleWandb, TheLastRankWritesTheLoggedValues) {
  const std::string dir = fresh_dir("gale_wandb_cli_pp2");
  test::RunResult r = test::run_with_timeout(
      tiny(2, {"--pipeline-model-parallel-size", "2", "--tensorboard-dir", dir + "/tb", "--wandb-project", "proj",
               "--wandb-exp-name", "exp", "--wandb-save-dir", dir + "/wb"}),
      kMpiEnv, 600);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count(r.output, "> W&B offline run " + dir + "/wb/wandb/offline-run-"), 1u) << r.output;
  const std::vector<std::string> files = run_files(dir + "/wb");
  ASSERT_EQ(files.size(), 1u);
  const std::vector<std::string> lines = testing::describe_wandb_run(files[0]);
  ASSERT_GE(lines.size(), 3u);
  EXPECT_EQ(lines[0], "1 header producer=gale min_consumer=0.40.0");
  EXPECT_NE(lines[1].find(" project=proj display_name=exp "), std::string::npos) << lines[1];
  EXPECT_NE(lines[1].find(" pipeline_model_parallel_size=2 "), std::string::npos);
  EXPECT_NE(lines[1].find(" wandb_project=\"proj\" "), std::string::npos);
  EXPECT_NE(lines[1].find(" rank=1 world_size=2"), std::string::npos);  // the last rank wrote
  EXPECT_EQ(lines.back(), std::to_string(lines.size()) + " exit exit_code=0 runtime=<t>");

  const auto rows = testing::wandb_history(files[0]);
  const std::vector<double> loss = testing::logged_values(r.output, "lm loss");
  const std::vector<double> lr = testing::logged_values(r.output, "learning rate");
  ASSERT_EQ(loss.size(), 4u);
  ASSERT_EQ(rows.size(), 4u);
  for (int64_t it = 1; it <= 4; ++it) {
    const std::map<std::string, std::string>& row = rows.at(it);
    EXPECT_NEAR(std::stod(row.at("lm loss")), loss[it - 1], 1e-6 * loss[it - 1]) << "iteration " << it;
    if (lr[it - 1] > 0) EXPECT_NEAR(std::stod(row.at("learning-rate")), lr[it - 1], 1e-6 * lr[it - 1]);
    EXPECT_EQ(row.at("samples vs steps"), std::to_string(4 * it));
    EXPECT_EQ(row.at("_step"), std::to_string(it));
    EXPECT_EQ(row.count("lm loss vs samples"), 0u);  // TensorBoard only, as Megatron
  }
  std::smatch m;
  std::regex block(R"(validation loss at iteration 2 \| lm loss value: ([0-9.E+-]+) \|)");
  ASSERT_TRUE(std::regex_search(r.output, m, block)) << r.output;
  EXPECT_NEAR(std::stod(rows.at(2).at("lm loss validation")), std::stod(m[1]), 1e-6 * std::stod(m[1]));
  fs::remove_all(dir);
}

// Without --wandb-save-dir the run goes to {--save}/wandb (Megatron's default).
TEST(GaleWandb, DefaultDirectoryIsUnderSave) {
  const std::string dir = fresh_dir("gale_wandb_cli_save");
  test::RunResult r = test::run_with_timeout(
      tiny(1, {"--train-iters", "2", "--eval-iters", "0", "--save", dir + "/ckpt", "--save-interval", "2",
               "--wandb-project", "proj", "--wandb-exp-name", "exp", "--log-timers-to-tensorboard"}),
      {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_EQ(run_files(dir + "/ckpt/wandb/wandb").size(), 1u) << r.output;
  // Without --tensorboard-dir Megatron logs only iteration-time (--log-timers-to-tensorboard) to W&B.
  const std::string file = run_files(dir + "/ckpt/wandb/wandb")[0];
  const auto rows = testing::wandb_history(file);
  ASSERT_EQ(rows.size(), 2u);
  for (int64_t it = 1; it <= 2; ++it) {
    EXPECT_GT(std::stod(rows.at(it).at("iteration-time")), 0.0);
    EXPECT_EQ(rows.at(it).size(), 4u);  // iteration-time, _step, _runtime, _timestamp
  }
  const std::vector<std::string> lines = testing::describe_wandb_run(file);
  ASSERT_EQ(lines.size(), 7u);
  EXPECT_EQ(lines[6], "7 exit exit_code=0 runtime=<t>");
  fs::remove_all(dir);
}

// A write that fails (a file-size limit of 4 or 8 KiB: the run record with its config, ~14 KB, is
// larger) stops the run with an error naming --wandb-save-dir and the file, as a failed TensorBoard
// write does.
TEST(GaleWandb, AFailedWriteNamesTheFlag) {
  const std::string dir = fresh_dir("gale_wandb_cli_full");
  std::string command = "trap '' XFSZ; ulimit -f 8; exec";  // 8 blocks of 512 bytes (dash) or 1 KiB (bash)
  for (const std::string& a : tiny(1, {"--wandb-project", "proj", "--wandb-exp-name", "exp", "--wandb-save-dir", dir}))
    command += " '" + a + "'";
  test::RunResult r = test::run_with_timeout({"/bin/sh", "-c", command}, {}, 120);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("gale pretrain: error: --wandb-save-dir: cannot write " + dir + "/wandb/offline-run-"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find(": File too large"), std::string::npos);
  fs::remove_all(dir);
}

TEST(GaleWandb, MegatronsValidationErrors) {
  test::RunResult r =
      test::run_with_timeout(tiny(1, {"--wandb-project", "proj", "--wandb-save-dir", "/nonexistent"}), {}, 120);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--wandb-exp-name: Please specify the wandb experiment name! (--wandb-project is 'proj')"),
            std::string::npos)
      << r.output;
  r = test::run_with_timeout(tiny(1, {"--wandb-project", "proj", "--wandb-exp-name", "e"}), {}, 120);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--wandb-project needs --wandb-save-dir or --save"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace gale
