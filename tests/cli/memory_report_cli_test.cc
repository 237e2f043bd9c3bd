// Megatron's memory report in `gale pretrain`'s output: the theoretical footprint (rank 0) and the
// "[Rank r] (after n iterations) memory (MB)" line (every data-parallel rank 0) after the first
// log lines, the line again every --log-memory-interval iterations, and the flag's check.
#include <gtest/gtest.h>

#include <regex>
#include <string>
#include <vector>

#include "cli/mpi_cli.h"
#include "subprocess.h"

namespace gale {
namespace {

struct ReportLine {
  int rank;
  int64_t iteration;
  double allocated, max_allocated, reserved, max_reserved;
};

std::vector<ReportLine> report_lines(const std::string& output) {
  static const std::regex re(
      R"(\n\[Rank (\d+)\] \(after (\d+) iterations\) memory \(MB\) \| allocated: ([0-9.]+) \| max allocated: ([0-9.]+) \| reserved: ([0-9.]+) \| max reserved: ([0-9.]+)\n)");
  std::vector<ReportLine> out;
  for (std::sregex_iterator it(output.begin(), output.end(), re), end; it != end; ++it)
    out.push_back({std::stoi((*it)[1]), std::stoll((*it)[2]), std::stod((*it)[3]), std::stod((*it)[4]),
                   std::stod((*it)[5]), std::stod((*it)[6])});
  return out;
}

size_t count(const std::string& output, const std::string& text) {
  size_t n = 0;
  for (size_t at = output.find(text); at != std::string::npos; at = output.find(text, at + 1)) ++n;
  return n;
}

// --log-interval 2 over 8 iterations with --log-memory-interval 4: the report after the first line
// (iteration 2 > 0 + 1, so the flag drops there), then at 4 and 8; the footprint once, from
// Megatron's formula for this model (activation = 1.05·(S·B·H·(10 + 24) + 8·S·B + S·B·H +
// 2·(S·B·V + S·B·H)) bytes).
TEST(MemoryReportCli, AfterTheFirstLineAndEveryLogMemoryInterval) {
  test::RunResult r = test::run_with_timeout(
      testing::tiny_gpt_pretrain(1, 8, {"--log-interval", "2", "--log-memory-interval", "4"}, {}), {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<ReportLine> lines = report_lines(r.output);
  ASSERT_EQ(lines.size(), 3u) << r.output;
  const int64_t iterations[] = {2, 4, 8};
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(lines[i].rank, 0);
    EXPECT_EQ(lines[i].iteration, iterations[i]);
    EXPECT_GT(lines[i].allocated, 0.0);
    EXPECT_LE(lines[i].allocated, lines[i].max_allocated);
    EXPECT_LE(lines[i].allocated, lines[i].reserved);
    EXPECT_LE(lines[i].reserved, lines[i].max_reserved);
  }
  EXPECT_EQ(count(r.output, "Theoretical memory footprints: weight and optimizer="), 1u) << r.output;
  // S 32, B 1, H 64, L 2, V 4224 (NullTokenizer's 4096 ids and EOD, padded to a multiple of 128): 0.42 MB.
  const double activation = 1.05 * (32.0 * 64 * 34 * 2 + 8.0 * 32 + 32.0 * 64 + 2.0 * (32.0 * 4224 + 32.0 * 64));
  char expected[64];
  std::snprintf(expected, sizeof expected, "activation=%.2f MB", activation / (1024.0 * 1024.0));
  EXPECT_NE(r.output.find(expected), std::string::npos) << expected << "\n" << r.output;
  // The report follows the log line of its iteration.
  EXPECT_LT(r.output.find(" iteration        2/"), r.output.find("[Rank 0] (after 2 iterations)"));
  EXPECT_LT(r.output.find("[Rank 0] (after 2 iterations)"), r.output.find(" iteration        4/"));
}

// --log-interval 1: Megatron reports after iterations 1 and 2 (the flag holds until an iteration
// past the first trained one), footprint included both times.
TEST(MemoryReportCli, FirstTwoLinesAtLogIntervalOne) {
  test::RunResult r = test::run_with_timeout(testing::tiny_gpt_pretrain(1, 4, {"--log-interval", "1"}, {}), {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<ReportLine> lines = report_lines(r.output);
  ASSERT_EQ(lines.size(), 2u) << r.output;
  EXPECT_EQ(lines[0].iteration, 1);
  EXPECT_EQ(lines[1].iteration, 2);
  EXPECT_EQ(count(r.output, "Theoretical memory footprints: "), 2u) << r.output;
}

// Data parallelism 2: only data-parallel rank 0 prints its line; tensor parallelism 2: both ranks
// are data-parallel rank 0 and print theirs.
TEST(MemoryReportCli, EveryDataParallelRankZeroPrints) {
  test::RunResult dp = test::run_with_timeout(
      testing::tiny_gpt_pretrain(2, 2, {"--log-interval", "2"}, {}), testing::kMpiEnv, 300);
  ASSERT_EQ(dp.exit_code, 0) << dp.output;
  std::vector<ReportLine> lines = report_lines(dp.output);
  ASSERT_EQ(lines.size(), 1u) << dp.output;
  EXPECT_EQ(lines[0].rank, 0);
  test::RunResult tp = test::run_with_timeout(
      testing::tiny_gpt_pretrain(2, 2, {"--log-interval", "2", "--tensor-model-parallel-size", "2"}, {}),
      testing::kMpiEnv, 300);
  ASSERT_EQ(tp.exit_code, 0) << tp.output;
  lines = report_lines(tp.output);
  ASSERT_EQ(lines.size(), 2u) << tp.output;
  EXPECT_NE(lines[0].rank, lines[1].rank);
  EXPECT_EQ(count(tp.output, "Theoretical memory footprints: "), 1u) << tp.output;  // rank 0 only
}

TEST(MemoryReportCli, LogMemoryIntervalMustBeAMultipleOfLogInterval) {
  for (const char* bad : {"3", "0"}) {
    test::RunResult r = test::run_with_timeout(
        testing::tiny_gpt_pretrain(1, 4, {"--log-interval", "2", "--log-memory-interval", bad}, {}), {}, 300);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.output.find(std::string("--log-memory-interval: expected a positive multiple of --log-interval 2 (as "
                                        "Megatron asserts), found ") + bad),
              std::string::npos)
        << r.output;
  }
}

}  // namespace
}  // namespace gale
