// `gale pretrain --rerun-mode` end to end (Megatron's rerun state machine): a real NaN loss and an
// injected reproducible result checkpoint the iteration's start and exit 16; the resumed job exits
// 16 again on the same node and 17 elsewhere ($GALE_NODE_NAME), with the tracker file's lines; a
// transient error exits 17 without a checkpoint; a non-fatal check reruns and goes on with the
// plain run's losses; report_stats reruns every iteration with the plain run's losses; two
// data-parallel ranks under mpirun decide together, and two pipeline stages report together.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/log_line.h"
#include "cli/mpi_cli.h"
#include "data/data_test_util.h"
#include "subprocess.h"

namespace gale {
namespace {

using testing::logged_values;
using testing::TempDir;

// 4 iterations of the tiny GPT (tests/cli/mpi_cli.h), a log line each.
test::RunResult gale(int np, std::vector<std::string> flags, std::vector<std::string> env = {}) {
  flags.insert(flags.end(), {"--log-interval", "1"});
  if (np > 1) env.insert(env.end(), testing::kMpiEnv.begin(), testing::kMpiEnv.end());
  return test::run_with_timeout(testing::tiny_gpt_pretrain(np, 4, flags, {}), env, 300);
}

std::vector<std::string> save_to(const TempDir& dir) {
  return {"--save", dir.file("ckpt"), "--load", dir.file("ckpt"), "--save-interval", "100"};
}

std::vector<std::string> concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The status= fields of the tracker file, in order.
std::vector<std::string> tracked_statuses(const std::string& path) {
  std::istringstream in(testing::read_file(path));
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) {
    const size_t at = line.find(" status=");
    if (at != std::string::npos) out.push_back(line.substr(at + 8, line.find(' ', at + 8) - at - 8));
  }
  return out;
}

TEST(RerunCli, RealNanLossIsCheckpointedAndDiagnosedElsewhere) {
  TempDir dir;
  const std::vector<std::string> flags =
      concat({"--lr", "1e30", "--rerun-mode", "validate_results", "--result-rejected-tracker-filename",
              dir.file("tracker.txt")},
             save_to(dir));
  const test::RunResult first = gale(1, flags, {"GALE_NODE_NAME=node-a"});
  ASSERT_EQ(first.exit_code, 16) << first.output;  // iteration 2's loss is NaN after a step of lr 1e30
  EXPECT_NE(first.output.find("First rerun: unexpected result is reproducible within the tolerance"), std::string::npos)
      << first.output;
  EXPECT_EQ(logged_values(first.output, "lm loss").size(), 1u) << first.output;
  const nlohmann::json meta =
      nlohmann::json::parse(testing::read_file(dir.file("ckpt/iter_0000001/metadata.json")));
  ASSERT_TRUE(meta.contains("rerun_state_machine")) << meta.dump();
  EXPECT_EQ(meta["rerun_state_machine"]["ranks"][0]["message"], "found NaN in local forward loss calculation");

  const test::RunResult same = gale(1, flags, {"GALE_NODE_NAME=node-a"});
  ASSERT_EQ(same.exit_code, 16) << same.output;  // rescheduled on the failing node: nothing learnt
  const test::RunResult other = gale(1, flags, {"GALE_NODE_NAME=node-b"});
  ASSERT_EQ(other.exit_code, 17) << other.output;  // NaN again elsewhere: the application's result, fatal
  EXPECT_NE(other.output.find("Correct result (but possible Application error)"), std::string::npos) << other.output;
  EXPECT_EQ(tracked_statuses(dir.file("tracker.txt")),
            (std::vector<std::string>{"initial_run", "first_rerun_reproducible", "second_rerun_reproducible"}));
  EXPECT_NE(testing::read_file(dir.file("tracker.txt")).find(" result=nan message='found NaN in local forward loss "
                                                              "calculation'"),
            std::string::npos);  // Megatron's spelling, without the C library's "-nan"
}

TEST(RerunCli, InjectedResultsOnTheirWayThroughTheStates) {
  {
    TempDir dir;
    const std::vector<std::string> flags = concat({"--rerun-mode", "validate_results", "--error-injection-rate", "1",
                                                   "--error-injection-type", "persistent_error"},
                                                  save_to(dir));
    const test::RunResult first = gale(1, flags, {"GALE_NODE_NAME=node-a"});
    ASSERT_EQ(first.exit_code, 16) << first.output;
    const test::RunResult same = gale(1, flags, {"GALE_NODE_NAME=node-a"});
    ASSERT_EQ(same.exit_code, 16) << same.output;
    EXPECT_NE(same.output.find("Got rescheduled on the same node and device"), std::string::npos) << same.output;
    const test::RunResult other = gale(1, flags, {"GALE_NODE_NAME=node-b"});
    ASSERT_EQ(other.exit_code, 17) << other.output;
    EXPECT_NE(other.output.find("Possible persistent error"), std::string::npos) << other.output;
  }
  {
    TempDir dir;
    const test::RunResult transient = gale(1, concat({"--rerun-mode", "validate_results", "--error-injection-rate", "1"},
                                                     save_to(dir)));
    ASSERT_EQ(transient.exit_code, 17) << transient.output;
    EXPECT_NE(transient.output.find("Possible transient error"), std::string::npos) << transient.output;
    EXPECT_FALSE(std::filesystem::exists(dir.file("ckpt")));  // resumed from an earlier checkpoint, if any
  }
}

TEST(RerunCli, NonFatalChecksAndReportStatsKeepThePlainLosses) {
  const test::RunResult plain = gale(1, {});
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  const std::vector<double> losses = logged_values(plain.output, "lm loss");
  ASSERT_EQ(losses.size(), 4u);
  // Only the large-gradient check (not fatal), rejected by injection at every iteration but the
  // first: each reruns, reproduces and goes on.
  const test::RunResult large =
      gale(1, {"--no-check-for-nan-in-loss-and-grad", "--check-for-large-grads", "--rerun-mode", "validate_results",
               "--error-injection-rate", "1", "--error-injection-type", "correct_result"});
  ASSERT_EQ(large.exit_code, 0) << large.output;
  EXPECT_EQ(logged_values(large.output, "lm loss"), losses);
  size_t continued = 0;
  for (size_t at = 0; (at = large.output.find("Continuing normal execution", at)) != std::string::npos; ++at) ++continued;
  EXPECT_EQ(continued, 3u) << large.output;
  const test::RunResult stats =
      gale(1, {"--rerun-mode", "report_stats", "--check-for-spiky-loss", "--check-for-large-grads"});
  ASSERT_EQ(stats.exit_code, 0) << stats.output;
  EXPECT_EQ(logged_values(stats.output, "lm loss"), losses);
  EXPECT_NE(stats.output.find("  From validation call 'Spiky loss':\n    12 samples, all identical"), std::string::npos)
      << stats.output;  // 4 micro-batches × iterations 1-3, reported after the third
}

TEST(RerunCli, DataParallelRanksDecideTogether) {
  TempDir dir;
  const std::vector<std::string> flags = concat({"--rerun-mode", "validate_results", "--error-injection-rate", "1",
                                                 "--error-injection-type", "correct_result"},
                                                save_to(dir));
  const test::RunResult first = gale(2, flags, {"GALE_NODE_NAME=node-a"});
  ASSERT_EQ(first.exit_code, 16) << first.output;
  const nlohmann::json meta =
      nlohmann::json::parse(testing::read_file(dir.file("ckpt/iter_0000001/metadata.json")));
  ASSERT_EQ(meta["rerun_state_machine"]["ranks"].size(), 2u) << meta.dump();
  EXPECT_EQ(meta["rerun_state_machine"]["ranks"][1]["suspicious_device"], 1);
  const test::RunResult other = gale(2, flags, {"GALE_NODE_NAME=node-b"});
  ASSERT_EQ(other.exit_code, 17) << other.output;
  EXPECT_NE(other.output.find("Second rerun: unexpected result is reproducible on different hardware"),
            std::string::npos)
      << other.output;
  // report_stats gathers every rank's statistics to rank 0: two pipeline stages' gradient-norm
  // checks over iterations 1-3, the last stage's loss checks, and the plain pipeline's losses.
  const std::vector<std::string> pp = {"--pipeline-model-parallel-size", "2"};
  const test::RunResult plain = gale(2, pp);
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  const test::RunResult stats = gale(2, concat(pp, {"--rerun-mode", "report_stats"}));
  ASSERT_EQ(stats.exit_code, 0) << stats.output;
  EXPECT_EQ(logged_values(stats.output, "lm loss"), logged_values(plain.output, "lm loss"));
  for (const char* line : {"  From validation call 'found NaN in local grad norm for model chunk #0 after the backward "
                           "pass':\n    6 samples, all identical",
                           "  From validation call 'found NaN in local forward loss calculation':\n    12 samples, all "
                           "identical"})
    EXPECT_NE(stats.output.find(line), std::string::npos) << line << "\n" << stats.output;
  const test::RunResult wrong_size = gale(1, flags, {"GALE_NODE_NAME=node-b"});
  EXPECT_EQ(wrong_size.exit_code, 1) << wrong_size.output;
  EXPECT_NE(wrong_size.output.find("the pending rerun was saved by 2 ranks; resume it with the same number of ranks"),
            std::string::npos)
      << wrong_size.output;
}

}  // namespace
}  // namespace gale
