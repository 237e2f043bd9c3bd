// `gale pretrain --timing-log-level`: Megatron's "(min, max) time across ranks (ms):" block after
// each log line with the timers of the level and none above it, the checkpoint and set-up timers
// at level 0, the '<name>-time' TensorBoard scalars, --timing-log-option, and the report across
// two pipeline ranks under mpirun (printed once, by the last rank). Timings are never compared with
// fixed numbers, only with each other (a phase is never longer than what contains it).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <regex>
#include <sstream>

#include "cli/mpi_cli.h"
#include "subprocess.h"
#include "testing_tensorboard.h"

namespace gale {
namespace {

namespace fs = std::filesystem;
using testing::kMpiEnv;

// A tiny GPT for 4 iterations of 4 samples, a log line every 2, no evaluation.
std::vector<std::string> tiny(int np, std::vector<std::string> extra) {
  return testing::tiny_gpt_pretrain(np, 4, {"--log-interval", "2"}, extra);
}

std::string fresh_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + name;
  fs::remove_all(dir);
  return dir;
}

// One printed report: its header, and each timer's (min, max) in milliseconds (max only: both the
// same), in order; `after` is the line before the header.
struct Block {
  std::string header, after;
  std::vector<std::string> names;
  std::vector<std::pair<double, double>> min_max;
  double max_of(const std::string& name) const {
    auto it = std::find(names.begin(), names.end(), name);
    EXPECT_NE(it, names.end()) << name;
    return it == names.end() ? 0.0 : min_max[static_cast<size_t>(it - names.begin())].second;
  }
};

// Megatron's memory report (train/theoretical_memory.h, train/memory_report.h), which comes between
// the first log lines and their timer reports, as in Megatron's training_log.
bool is_memory_report_line(const std::string& line) {
  for (const char* start : {"[Rank ", "Number of ", "Total number of ", "Theoretical memory footprints",
                            "compute_activation_memory", "Activation memory footprint", "Memory penalty"})
    if (line.rfind(start, 0) == 0) return true;
  return line.empty();
}

// A line another rank may print while the last rank prints a report: rank 0's memory report (with
// two pipeline stages the last rank prints the timers), its "[after training] ..." and "[after
// training is done] datetime" lines. mpirun forwards each rank's lines as they come, so they can
// land anywhere in the last rank's report.
bool is_other_rank_line(const std::string& line) { return is_memory_report_line(line) || line[0] == '['; }

// The output's lines without those another rank may print (no report, log or header line starts so).
std::vector<std::string> lines_of(const std::string& output) {
  std::vector<std::string> lines;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);)
    if (!is_other_rank_line(line)) lines.push_back(line);
  return lines;
}

// The minmax and max reports in `output`.
std::vector<Block> blocks_of(const std::string& output) {
  static const std::regex minmax(R"(^    (\S+) \.*: \((\d+\.\d\d), (\d+\.\d\d)\)$)");
  static const std::regex max_only(R"(^    (\S+) \.*: (\d+\.\d\d)$)");
  const std::vector<std::string> lines = lines_of(output);
  std::vector<Block> blocks;
  for (size_t i = 0; i < lines.size(); ++i) {
    const bool is_minmax = lines[i] == "(min, max) time across ranks (ms):";
    if (!is_minmax && lines[i] != "max time across ranks (ms):") continue;
    Block b;
    b.header = lines[i];
    b.after = i > 0 ? lines[i - 1] : "";
    std::smatch m;
    for (size_t j = i + 1; j < lines.size(); ++j) {
      if (!std::regex_match(lines[j], m, is_minmax ? minmax : max_only)) break;
      b.names.push_back(m[1]);
      const double lo = std::stod(m[2]), hi = is_minmax ? std::stod(m[3]) : lo;
      b.min_max.emplace_back(lo, hi);
    }
    blocks.push_back(b);
  }
  return blocks;
}

bool is_log_line(const std::string& line) {
  return line.find(" iteration ") != std::string::npos && line.find("consumed samples:") != std::string::npos;
}

// The reports printed right after a log line.
std::vector<Block> interval_blocks(const std::vector<Block>& blocks) {
  std::vector<Block> out;
  for (const Block& b : blocks)
    if (is_log_line(b.after)) out.push_back(b);
  return out;
}

// The reports of the training timers (under mpirun other ranks' lines may come between a log
// line and its report, so they are found by their first timer).
std::vector<Block> training_blocks(const std::vector<Block>& blocks) {
  std::vector<Block> out;
  for (const Block& b : blocks)
    if (!b.names.empty() && b.names[0] == "forward-backward") out.push_back(b);
  return out;
}

const std::vector<std::string> kLevel1 = {"forward-backward",       "layernorm-grads-all-reduce",
                                          "embedding-grads-all-reduce", "all-grads-sync",
                                          "optimizer-clip-main-grad", "optimizer-count-zeros",
                                          "optimizer-inner-step",   "optimizer"};
const std::vector<std::string> kLevel2 = {"batch-generator", "forward-compute", "backward-compute"};

// Containment: a phase never takes longer than the timer around it. `pipelined`: the pipeline
// schedules load every micro-batch before the first forward, so batch-generator is not inside
// forward-compute there and the two are not compared.
void expect_consistent(const Block& b, bool level2, bool pipelined = false) {
  for (size_t i = 0; i < b.names.size(); ++i) {
    EXPECT_LE(b.min_max[i].first, b.min_max[i].second) << b.names[i];
    EXPECT_GE(b.min_max[i].first, 0.0) << b.names[i];
  }
  const double fb = b.max_of("forward-backward"), opt = b.max_of("optimizer");
  EXPECT_GT(fb, 0.0);
  EXPECT_GE(fb, b.max_of("all-grads-sync"));
  for (const char* phase : {"optimizer-clip-main-grad", "optimizer-count-zeros", "optimizer-inner-step"})
    EXPECT_GE(opt, b.max_of(phase)) << phase;
  if (!level2) return;
  EXPECT_GE(fb, b.max_of("forward-compute"));
  EXPECT_GE(fb, b.max_of("backward-compute"));
  if (!pipelined)
    EXPECT_GE(b.max_of("forward-compute"), b.max_of("batch-generator"));  // without pipelining it reads the batch
  EXPECT_GT(b.max_of("backward-compute"), 0.0);
}

TEST(GaleTimers, LevelZeroReportsSetUpAndCheckpointsOnly) {
  const std::string dir = fresh_dir("gale_timers_level0");
  test::RunResult r = test::run_with_timeout(tiny(1, {"--save", dir + "/ckpt", "--save-interval", "2"}), {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<Block> blocks = blocks_of(r.output);
  // Megatron's order: the set-up report before "training ...", then one report after each save.
  ASSERT_EQ(blocks.size(), 3u) << r.output;
  EXPECT_EQ(blocks[0].header, "(min, max) time across ranks (ms):");
  EXPECT_EQ(blocks[0].names, (std::vector<std::string>{"model-and-optimizer-setup", "train/valid/test-data-iterators-setup"}));
  EXPECT_NE(r.output.find(blocks[0].names.back()), std::string::npos);
  const std::vector<std::string> lines = lines_of(r.output);
  auto training = std::find(lines.begin(), lines.end(), "training ...");
  ASSERT_NE(training, lines.end());
  EXPECT_EQ(training[-1].rfind("    train/valid/test-data-iterators-setup ", 0), 0u);
  for (size_t i = 1; i < 3; ++i) EXPECT_EQ(blocks[i].names, std::vector<std::string>{"save-checkpoint"});
  EXPECT_TRUE(interval_blocks(blocks).empty()) << r.output;

  // --load: the load-checkpoint report, before the set-up report (the load is part of that set-up).
  test::RunResult resumed = test::run_with_timeout(
      tiny(1, {"--load", dir + "/ckpt", "--train-iters", "6", "--timing-log-option", "max"}), {}, 300);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const std::vector<Block> after = blocks_of(resumed.output);
  ASSERT_EQ(after.size(), 2u) << resumed.output;
  EXPECT_EQ(after[0].header, "max time across ranks (ms):");
  EXPECT_EQ(after[0].names, std::vector<std::string>{"load-checkpoint"});
  EXPECT_EQ(after[1].names.size(), 2u);
}

TEST(GaleTimers, LevelOneAndTwoReportEachIntervalWithTheirTimersOnly) {
  for (int level : {1, 2}) {
    SCOPED_TRACE(level);
    test::RunResult r = test::run_with_timeout(tiny(1, {"--timing-log-level", std::to_string(level)}), {}, 300);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::vector<Block> blocks = interval_blocks(blocks_of(r.output));
    ASSERT_EQ(blocks.size(), 2u) << r.output;  // iterations 2 and 4
    std::vector<std::string> expected = kLevel1;
    if (level == 2) expected.insert(expected.end(), kLevel2.begin(), kLevel2.end());
    for (const Block& b : blocks) {
      EXPECT_EQ(b.header, "(min, max) time across ranks (ms):");
      EXPECT_EQ(b.names, expected) << r.output;  // no pipeline, fp16, bf16 or distributed-optimizer timers
      for (const auto& [lo, hi] : b.min_max) EXPECT_EQ(lo, hi);  // one rank
      expect_consistent(b, level == 2);
    }
  }
}

TEST(GaleTimers, HalfPrecisionAndDistributedOptimizerTimers) {
  test::RunResult r = test::run_with_timeout(
      // A constant loss scale: every step is applied (the dynamic scaler's first steps overflow).
      tiny(1, {"--timing-log-level", "1", "--fp16", "--loss-scale", "128", "--use-distributed-optimizer"}), {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<Block> blocks = interval_blocks(blocks_of(r.output));
  ASSERT_EQ(blocks.size(), 2u) << r.output;
  EXPECT_EQ(blocks[0].names, (std::vector<std::string>{
                                 "forward-backward", "layernorm-grads-all-reduce", "embedding-grads-all-reduce",
                                 "all-grads-sync", "params-all-gather", "optimizer-unscale-and-check-inf",
                                 "optimizer-clip-main-grad", "optimizer-count-zeros", "optimizer-inner-step",
                                 "optimizer-copy-main-to-model-params", "optimizer"}));
  for (const Block& b : blocks)
    for (const char* phase : {"optimizer-unscale-and-check-inf", "optimizer-copy-main-to-model-params"})
      EXPECT_GE(b.max_of("optimizer"), b.max_of(phase)) << phase;
}

TEST(GaleTimers, WritesEachReportedTimerToTensorBoard) {
  const std::string dir = fresh_dir("gale_timers_tb");
  test::RunResult r = test::run_with_timeout(
      tiny(1, {"--timing-log-level", "2", "--tensorboard-dir", dir, "--log-timers-to-tensorboard",
               "--tensorboard-log-interval", "100"}),
      {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<Block> blocks = interval_blocks(blocks_of(r.output));
  ASSERT_EQ(blocks.size(), 2u) << r.output;
  // With --tensorboard-log-interval 100 only the log-interval scalars remain: iteration-time, then
  // '<name>-time' for each printed timer (the maximum across ranks per iteration, in seconds).
  std::vector<std::pair<std::string, int64_t>> expected;
  for (int64_t step : {2, 4}) {
    expected.emplace_back("iteration-time", step);
    for (const std::string& name : blocks[0].names) expected.emplace_back(name + "-time", step);
  }
  const std::vector<testing::TbEvent> events = testing::read_scalar_events(dir);
  std::vector<std::pair<std::string, int64_t>> written;
  for (const testing::TbEvent& e : events) written.emplace_back(e.tag, e.step);
  EXPECT_EQ(written, expected);
  size_t k = 0;
  for (const Block& b : blocks) {
    ++k;  // iteration-time
    for (size_t i = 0; i < b.names.size(); ++i, ++k) {
      ASSERT_LT(k, events.size());
      EXPECT_NEAR(events[k].value * 1000.0, b.min_max[i].second, 0.005 + 1e-6 * b.min_max[i].second) << b.names[i];
    }
  }
}

TEST(GaleTimers, RejectsBadLevelsAndOptions) {
  test::RunResult r = test::run_with_timeout(tiny(1, {"--timing-log-level", "3"}), {}, 60);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--timing-log-level: expected 0, 1 or 2, found 3"), std::string::npos) << r.output;
  r = test::run_with_timeout(tiny(1, {"--timing-log-option", "min"}), {}, 60);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--timing-log-option"), std::string::npos) << r.output;
}

// Two pipeline stages: the last rank prints one report per interval, whose minimum and maximum
// cover both ranks; each stage receives in one direction only.
TEST(GaleTimers, ReportsAcrossTwoPipelineRanks) {
  test::RunResult r = test::run_with_timeout(
      tiny(2, {"--timing-log-level", "2", "--pipeline-model-parallel-size", "2"}), kMpiEnv, 600);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<Block> blocks = training_blocks(blocks_of(r.output));
  ASSERT_EQ(blocks.size(), 2u) << r.output;  // printed by the last rank only
  for (const Block& b : blocks) {
    for (const char* name : {"forward-recv", "forward-send", "backward-recv", "backward-send",
                             "embedding-grads-all-reduce"})
      EXPECT_NE(std::find(b.names.begin(), b.names.end(), name), b.names.end()) << name;
    expect_consistent(b, /*level2=*/true, /*pipelined=*/true);
  }

  // --timing-log-option all: every rank's own time; rank 1 (last stage) alone receives activations,
  // rank 0 (first stage) alone receives gradients.
  r = test::run_with_timeout(
      tiny(2, {"--timing-log-level", "2", "--pipeline-model-parallel-size", "2", "--timing-log-option", "all"}),
      kMpiEnv, 600);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<std::string> lines = lines_of(r.output);
  std::vector<size_t> reports;  // of the training timers (the set-up report comes first)
  for (size_t i = 0; i + 1 < lines.size(); ++i)
    if (lines[i] == "times across ranks (ms):" && lines[i + 1] == "  forward-backward:") reports.push_back(i);
  ASSERT_EQ(reports.size(), 2u) << r.output;
  std::map<std::string, std::vector<std::string>> ranks;  // timer -> "rank  r" entries of the first report
  std::string current;
  static const std::regex rank_line(R"(^     (rank [ \d]\d): \d+\.\d\d$)");
  for (size_t i = reports[0] + 1; i < lines.size(); ++i) {
    std::smatch m;
    if (std::regex_match(lines[i], m, rank_line)) {
      ranks[current].push_back(m[1]);
    } else if (lines[i].size() > 3 && lines[i].rfind("  ", 0) == 0 && lines[i][2] != ' ' && lines[i].back() == ':') {
      current = lines[i].substr(2, lines[i].size() - 3);
    } else {
      break;
    }
  }
  EXPECT_EQ(ranks["forward-backward"], (std::vector<std::string>{"rank  0", "rank  1"}));
  EXPECT_EQ(ranks["forward-compute"], (std::vector<std::string>{"rank  0", "rank  1"}));
  EXPECT_EQ(ranks["forward-recv"], std::vector<std::string>{"rank  1"});
  EXPECT_EQ(ranks["forward-send"], std::vector<std::string>{"rank  0"});
  EXPECT_EQ(ranks["backward-recv"], std::vector<std::string>{"rank  0"});
  EXPECT_EQ(ranks["backward-send"], std::vector<std::string>{"rank  1"});
}

}  // namespace
}  // namespace gale
