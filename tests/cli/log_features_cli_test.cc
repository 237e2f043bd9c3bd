// `gale pretrain` with MindSpeed's log-line features: --op-cal-tflops adds its two throughput
// fields after Megatron's (only with the flag and --log-throughput), and --async-log-allreduce
// under mpirun with two data-parallel ranks prints the same log lines, losses to the last digit,
// as the blocking all-reduce.
#include <gtest/gtest.h>

#include <algorithm>
#include <regex>
#include <sstream>

#include "cli/log_line.h"
#include "cli/mpi_cli.h"
#include "subprocess.h"

namespace gale {
namespace {

using testing::kMpiEnv;
using testing::logged_values;

// A tiny GPT for 4 iterations of 4 samples (2 micro-batches per rank at DP 2), a log line each.
std::vector<std::string> tiny(int np, std::vector<std::string> extra) {
  return testing::tiny_gpt_pretrain(np, 4, {"--log-interval", "1", "--log-throughput"}, extra);
}

const char kActual[] = "actual throughput per GPU (TFLOP/s/GPU)";
const char kWithRecompute[] = "actual throughput per GPU with recompute (TFLOP/s/GPU)";

size_t count_of(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

TEST(OpCalTflopsCli, FieldsFollowTheFormulasThroughputOnlyWithTheFlag) {
  const test::RunResult plain = test::run_with_timeout(tiny(1, {}), {}, 300);
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  EXPECT_EQ(plain.output.find("actual throughput"), std::string::npos) << plain.output;

  const test::RunResult counted = test::run_with_timeout(
      tiny(1, {"--op-cal-tflops", "--recompute-granularity", "full", "--recompute-method", "uniform",
               "--recompute-num-layers", "1"}),
      {}, 300);
  ASSERT_EQ(counted.exit_code, 0) << counted.output;
  EXPECT_NE(counted.output.find("active: op-cal-tflops (key scenarios, level 2)"), std::string::npos)
      << counted.output;
  const std::regex fields(
      R"(\| throughput per GPU \(TFLOP/s/GPU\): [0-9]+\.[0-9] \| actual throughput per GPU \(TFLOP/s/GPU\): )"
      R"([0-9]+\.[0-9] \| actual throughput per GPU with recompute \(TFLOP/s/GPU\): [0-9]+\.[0-9] \| learning rate: )");
  size_t lines = 0;
  for (std::sregex_iterator it(counted.output.begin(), counted.output.end(), fields), end; it != end; ++it) ++lines;
  EXPECT_EQ(lines, 4u) << counted.output;
  // The FLOPs of the run with recompute include the rerun forward: never fewer.
  const std::vector<double> actual = logged_values(counted.output, "actual throughput per GPU \\(TFLOP/s/GPU\\)");
  const std::vector<double> hfu =
      logged_values(counted.output, "actual throughput per GPU with recompute \\(TFLOP/s/GPU\\)");
  ASSERT_EQ(actual.size(), 4u);
  ASSERT_EQ(hfu.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_GE(hfu[i], actual[i]);
  EXPECT_EQ(logged_values(counted.output, "lm loss"), logged_values(plain.output, "lm loss"));  // counting changes nothing
}

TEST(OpCalTflopsCli, WithoutLogThroughputItSaysItIsOff) {
  std::vector<std::string> argv = tiny(1, {"--op-cal-tflops"});
  argv.erase(std::find(argv.begin(), argv.end(), "--log-throughput"));
  const test::RunResult r = test::run_with_timeout(argv, {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--op-cal-tflops is not active: its throughputs are printed only with --log-throughput"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(count_of(r.output, kActual) + count_of(r.output, kWithRecompute), 0u);
}

// The log lines without what differs from run to run: the timestamp, the time per iteration and
// the throughputs.
std::vector<std::string> comparable_log_lines(const std::string& output) {
  std::vector<std::string> out;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    if (line.find(" iteration ") == std::string::npos || line.find("consumed samples:") == std::string::npos) continue;
    line = std::regex_replace(line, std::regex(R"(^ \[[^\]]*\])"), "");
    line = std::regex_replace(line, std::regex(R"(elapsed time per iteration \(ms\): [0-9.]+)"), "elapsed");
    line = std::regex_replace(line, std::regex(R"(throughput per GPU \(TFLOP/s/GPU\): [0-9.]+)"), "throughput");
    out.push_back(line);
  }
  return out;
}

#ifdef GALE_MPIEXEC
TEST(AsyncLogAllreduceCli, SameLogLinesAsTheBlockingAllReduceUnderDataParallelism) {
  const test::RunResult blocking = test::run_with_timeout(tiny(2, {}), kMpiEnv, 300);
  const test::RunResult async = test::run_with_timeout(tiny(2, {"--async-log-allreduce"}), kMpiEnv, 300);
  ASSERT_EQ(blocking.exit_code, 0) << blocking.output;
  ASSERT_EQ(async.exit_code, 0) << async.output;
  EXPECT_NE(async.output.find("active: async-log-allreduce (communication, level 2)"), std::string::npos)
      << async.output;
  const std::vector<std::string> a = comparable_log_lines(blocking.output), b = comparable_log_lines(async.output);
  ASSERT_EQ(a.size(), 4u) << blocking.output;
  EXPECT_EQ(a, b);  // losses, grad norms, learning rates: every printed digit
  ASSERT_EQ(logged_values(async.output, "lm loss").size(), 4u);
}
#endif

}  // namespace
}  // namespace gale
