// `gale pretrain --log-progress`: Megatron's progress.txt in the --save directory — a "Starting
// job" line per job and a "Saved checkpoint" line per save, appended to by a resumed job, whose
// floating-point operations and tokens continue from the checkpoint.
#include <gtest/gtest.h>

#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "ckpt/temp_dir.h"
#include "cli/mpi_cli.h"
#include "subprocess.h"

namespace gale {
namespace {

using testing::kMpiEnv;
using testing::launch_argv;
using testing_util::read_bytes;
using testing_util::TempDir;

const std::string kModel =
    "pretrain --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 "
    "--max-position-embeddings 16 --micro-batch-size 1 --global-batch-size 2 --lr 1e-3 --mock-data "
    "--vocab-size 4096 --eval-iters 0 --num-threads 1 --log-interval 1 --log-progress";

test::RunResult pretrain(int np, const std::vector<std::string>& extra) {
  std::vector<std::string> program = {GALE_BINARY};
  std::istringstream words(kModel);
  for (std::string w; words >> w;) program.push_back(w);
  return test::run_with_timeout(launch_argv(np, program, extra), kMpiEnv, 300);
}

struct Line {
  int world = 0;
  std::string event;           // "Starting job" or "Saved checkpoint"
  int iteration = 0;           // saves only
  double flops = 0.0, tokens_billions = 0.0;
};

// progress.txt's lines, each checked against Megatron's format.
std::vector<Line> read_progress(const std::string& path) {
  const std::regex start("\\d{4}-\\d\\d-\\d\\d \\d\\d:\\d\\d:\\d\\d\tJob ID: [^\t]*\t# GPUs: (\\d+)\tStarting job");
  const std::regex save(
      "\\d{4}-\\d\\d-\\d\\d \\d\\d:\\d\\d:\\d\\d\tJob ID: [^\t]*\t# GPUs: (\\d+)\tSaved checkpoint\tIteration: (\\d+)\t"
      "Job throughput: \\d+\\.\\d TFLOP/s/GPU\tCumulative throughput: \\d+\\.\\d TFLOP/s/GPU\t"
      "Floating-point operations: (\\d\\.\\d\\de[+-]\\d\\d)\tTokens \\(in billions\\): (\\d+\\.\\d\\d)");
  std::vector<Line> lines;
  std::istringstream in(read_bytes(path));
  for (std::string text; std::getline(in, text);) {
    std::smatch m;
    Line l;
    if (std::regex_match(text, m, start)) {
      l.world = std::stoi(m[1]);
      l.event = "Starting job";
    } else if (std::regex_match(text, m, save)) {
      l.world = std::stoi(m[1]);
      l.event = "Saved checkpoint";
      l.iteration = std::stoi(m[2]);
      l.flops = std::stod(m[3]);
      l.tokens_billions = std::stod(m[4]);
    } else {
      ADD_FAILURE() << "not a progress.txt line: " << text;
    }
    lines.push_back(l);
  }
  return lines;
}

TEST(ProgressLogCli, StartAndSavesAppendedAcrossAResume) {
  TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  test::RunResult first = pretrain(1, {"--train-iters", "4", "--save-interval", "2", "--save", dir});
  ASSERT_EQ(first.exit_code, 0) << first.output;
  std::vector<Line> lines = read_progress(dir + "/progress.txt");
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0].event, "Starting job");
  EXPECT_EQ(lines[0].world, 1);
  EXPECT_EQ(lines[1].event, "Saved checkpoint");
  EXPECT_EQ(lines[1].iteration, 2);
  EXPECT_EQ(lines[2].iteration, 4);
  // Every iteration has the same operations: twice as many after 4 as after 2 (3 digits).
  ASSERT_GT(lines[1].flops, 0.0);
  EXPECT_NEAR(lines[2].flops / lines[1].flops, 2.0, 0.01);
  EXPECT_EQ(lines[2].tokens_billions, 0.0);  // 4 x 2 samples x 16 tokens
  // The resumed job appends; its operations continue from the checkpoint's.
  test::RunResult resumed = pretrain(1, {"--train-iters", "6", "--save-interval", "2", "--save", dir, "--load", dir});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  lines = read_progress(dir + "/progress.txt");
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[3].event, "Starting job");
  EXPECT_EQ(lines[4].event, "Saved checkpoint");
  EXPECT_EQ(lines[4].iteration, 6);
  EXPECT_NEAR(lines[4].flops / lines[1].flops, 3.0, 0.015);
}

TEST(ProgressLogCli, TwoRanksWriteOneFile) {
  TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  test::RunResult run = pretrain(2, {"--train-iters", "2", "--save-interval", "2", "--save", dir});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::vector<Line> lines = read_progress(dir + "/progress.txt");
  ASSERT_EQ(lines.size(), 2u);  // written once, by rank 0
  EXPECT_EQ(lines[0].world, 2);
  EXPECT_EQ(lines[1].iteration, 2);
}

TEST(ProgressLogCli, NothingWithoutSave) {
  TempDir tmp;
  test::RunResult run = pretrain(1, {"--train-iters", "1"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
}

}  // namespace
}  // namespace gale
