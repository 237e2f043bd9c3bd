// Megatron's progress.txt (--log-progress): the line format, the reading back of the start of the
// jobs of one world size (get_start_time_from_progress_log), and a job's lines on one process.
#include "train/progress_log.h"

#include <gtest/gtest.h>

#include <regex>

#include "ckpt/temp_dir.h"

namespace gale {
namespace {

using testing_util::read_bytes;
using testing_util::TempDir;
using testing_util::write_bytes;

TEST(ProgressLog, MegatronsLines) {
  EXPECT_EQ(progress_line("2026-12-01 10:00:00", "", 8, "Starting job"),
            "2026-12-01 10:00:00\tJob ID: \t# GPUs: 8\tStarting job");
  EXPECT_EQ(progress_line("2026-12-01 10:00:00", "4711", 2, "x"), "2026-12-01 10:00:00\tJob ID: 4711\t# GPUs: 2\tx");
  // Python's {:.1f}, {:.2e} and {:.2f}; tokens in billions.
  EXPECT_EQ(saved_checkpoint_text(false, 100, 12.345, 0.04, 1.23456e15, 2048000000),
            "Saved checkpoint\tIteration: 100\tJob throughput: 12.3 TFLOP/s/GPU\tCumulative throughput: 0.0 "
            "TFLOP/s/GPU\tFloating-point operations: 1.23e+15\tTokens (in billions): 2.05");
  EXPECT_EQ(saved_checkpoint_text(true, 2, 0.0, 0.0, 0.0, 0),
            "Saving async checkpoint\tIteration: 2\tJob throughput: 0.0 TFLOP/s/GPU\tCumulative throughput: 0.0 "
            "TFLOP/s/GPU\tFloating-point operations: 0.00e+00\tTokens (in billions): 0.00");
}

std::string line(const std::string& time, int world, const std::string& text) {
  return progress_line(time, "", world, text) + "\n";
}

std::string saved(const std::string& time, int world, double flops) {
  return line(time, world, saved_checkpoint_text(false, 1, 0.0, 0.0, flops, 0));
}

TEST(ProgressLog, StartOfTheJobsOfOneWorldSize) {
  EXPECT_FALSE(progress_start("", 2).has_value());
  // The first "Starting job" of the latest run of lines of this world size, with the operations of
  // the last save before it (of any world size).
  const std::string log = line("2026-01-01 00:00:00", 2, "Starting job") + saved("2026-01-01 00:01:00", 2, 1e12) +
                          line("2026-01-01 00:02:00", 4, "Starting job") + saved("2026-01-01 00:03:00", 4, 3e12) +
                          line("2026-01-01 00:04:00", 2, "Starting job") + saved("2026-01-01 00:05:00", 2, 5e12) +
                          line("2026-01-01 00:06:00", 2, "Starting job");
  auto two = progress_start(log, 2);
  ASSERT_TRUE(two.has_value());
  EXPECT_EQ(two->time, "2026-01-01 00:04:00");
  EXPECT_EQ(two->floating_point_operations, 3e12);
  auto four = progress_start(log, 4);  // lines of world size 2 came after
  EXPECT_FALSE(four.has_value());
  auto first = progress_start(line("2026-01-01 00:00:00", 2, "Starting job"), 2);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->floating_point_operations, 0.0);
}

TEST(ProgressLog, AppendsToProgressTxtInTheSaveDirectory) {
  TempDir tmp;
  ProgressLog none("", make_self_communicator("world"), wall_seconds());  // no --save: nothing
  EXPECT_TRUE(none.start_job().ok());
  EXPECT_EQ(none.path(), "");
  const std::string dir = tmp.file("ckpt");
  ProgressLog log(dir, make_self_communicator("world"), wall_seconds() - 2.0);  // the job started 2 s ago
  ASSERT_TRUE(log.start_job().ok());
  ASSERT_TRUE(log.saved_checkpoint(10, 4e12, 0.0, 1280, false).ok());
  const std::string text = read_bytes(dir + "/progress.txt");
  const std::regex expected(
      "\\d{4}-\\d\\d-\\d\\d \\d\\d:\\d\\d:\\d\\d\tJob ID: [^\t]*\t# GPUs: 1\tStarting job\n"
      "\\d{4}-\\d\\d-\\d\\d \\d\\d:\\d\\d:\\d\\d\tJob ID: [^\t]*\t# GPUs: 1\tSaved checkpoint\tIteration: 10\t"
      "Job throughput: (\\d+\\.\\d) TFLOP/s/GPU\tCumulative throughput: \\d+\\.\\d TFLOP/s/GPU\t"
      "Floating-point operations: 4\\.00e\\+12\tTokens \\(in billions\\): 0\\.00\n");
  std::smatch m;
  ASSERT_TRUE(std::regex_match(text, m, expected)) << text;
  // 4e12 operations in about 2 s: about 2 TFLOP/s.
  EXPECT_NEAR(std::stod(m[1]), 2.0, 0.3) << text;
  // A file without a "Starting job" line of this world size is an error.
  write_bytes(dir + "/progress.txt", line("2026-01-01 00:00:00", 8, "Starting job"));
  const Status st = log.saved_checkpoint(20, 1e12, 0.0, 0, false);
  EXPECT_EQ(st.message(), "--log-progress: " + dir + "/progress.txt holds no 'Starting job' line of a job with 1 "
                          "processes");
}

}  // namespace
}  // namespace gale
