// `gale pretrain --enable-ft-package` (Megatron's fault tolerance) end to end: a normal run at DP 2
// logs the same losses as without it and, with --calc-ft-timeouts, stores calculated timeouts in
// <save>/ft_state.json that the resumed run loads and extends; a rank that stalls makes the other
// rank's "step" section time out inside a collective, and the whole job ends with exit code 75 (not
// a hang) naming that rank; one process stalled out of any section ends the same way.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/log_line.h"
#include "cli/mpi_cli.h"
#include "subprocess.h"

namespace gale {
namespace {

namespace fs = std::filesystem;
using testing::kMpiEnv;
using testing::tiny_gpt_pretrain;

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("gale_ft_cli_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(d);
  return d;
}

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in, nullptr, false);
}

TEST(FtCli, SameLossesAndTimeoutsPersistedAcrossResume) {
  const fs::path dir = temp_dir("normal");
  const std::vector<std::string> common = {"--log-interval", "1"};
  test::RunResult plain = test::run_with_timeout(tiny_gpt_pretrain(2, 17, common, {}), kMpiEnv, 300);
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  // The calculated timeouts come from this tiny model (fractions of a second) and apply at once:
  // the watchdog never checks here (interval 3600 s), so a loaded machine cannot trip them.
  const std::vector<std::string> ft = {"--enable-ft-package", "--calc-ft-timeouts", "--save", dir.string(),
                                       "--save-interval", "8", "--ft-param-workload_check_interval", "3600"};
  test::RunResult r = test::run_with_timeout(tiny_gpt_pretrain(2, 17, with(common, ft), {}), kMpiEnv, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Fault tolerance only watches: the losses are the same, bit for bit as printed.
  const std::vector<double> want = testing::logged_values(plain.output, "lm loss");
  ASSERT_EQ(want.size(), 17u) << plain.output;
  EXPECT_EQ(testing::logged_values(r.output, "lm loss"), want) << r.output;
  EXPECT_NE(r.output.find("FT: initialized. Timeouts: setup=600.00s, step=180.00s, checkpointing=420.00s, "
                          "out-of-section=300.00s"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("FT: updated timeouts saved to " + (dir / "ft_state.json").string()), std::string::npos)
      << r.output;
  // Saves at 8 and 16 (checkpointing), then the end at 17: 17 >= 16 iterations seen (step);
  // nothing loaded (no setup), hence no out-of-section timeout either.
  nlohmann::json state = read_json(dir / "ft_state.json");
  ASSERT_TRUE(state.is_object()) << r.output;
  const nlohmann::json& s = state["current_timeouts"]["section"];
  EXPECT_EQ(s["calculated_sections"], nlohmann::json::array({"checkpointing", "step"})) << state.dump();
  EXPECT_EQ(s["section"]["setup"], 600.0) << state.dump();
  EXPECT_EQ(s["is_out_of_section_calculated"], false) << state.dump();
  const double step = s["section"]["step"].get<double>();
  EXPECT_GT(step, 0.0);
  EXPECT_LT(step, 180.0);  // 5 × a tiny iteration (generous: any machine does one in under 36 s)

  // The resumed run (one process) starts from those timeouts and, a checkpoint having been
  // loaded, calculates the setup timeout too; the step timeout it keeps (2 iterations < 16).
  test::RunResult resumed = test::run_with_timeout(
      tiny_gpt_pretrain(1, 19, {"--enable-ft-package", "--calc-ft-timeouts", "--load", dir.string(), "--save",
                                dir.string(), "--save-interval", "100", "--ft-param-workload_check_interval", "3600"},
                        {}),
      kMpiEnv, 300);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("FT: loaded timeouts from " + (dir / "ft_state.json").string()), std::string::npos)
      << resumed.output;
  nlohmann::json after = read_json(dir / "ft_state.json");
  const nlohmann::json& a = after["current_timeouts"]["section"];
  EXPECT_EQ(a["calculated_sections"], nlohmann::json::array({"checkpointing", "setup", "step"})) << after.dump();
  EXPECT_EQ(a["section"]["step"], s["section"]["step"]) << after.dump();
  EXPECT_LT(a["section"]["setup"].get<double>(), 600.0) << after.dump();
  fs::remove_all(dir);
}

// Rank 0 stalls before iteration 3 (out of section: no out-of-section timeout); rank 1 enters the
// iteration's "step" and waits for rank 0 in a collective until its 1 s timeout passes.
TEST(FtCli, RankHungInACollectiveEndsTheJob) {
  const fs::path dir = temp_dir("hang");
  std::vector<std::string> env = kMpiEnv;
  env.push_back("GALE_FT_TEST_STALL=0:3");
  test::RunResult r = test::run_with_timeout(
      tiny_gpt_pretrain(2, 6,
                        {"--enable-ft-package", "--save", dir.string(), "--save-interval", "100", "--ft-param-rank_section_timeouts",
                         "setup:600,step:1,checkpointing:none", "--ft-param-rank_out_of_section_timeout", "none", "--ft-num-warmup-iters", "1",
                         "--ft-param-workload_check_interval", "0.1"},
                        {}),
      env, 180);  // generous: the timeout passes after about 1 s
  ASSERT_FALSE(r.timed_out) << "the job hung:\n" << r.output;
  EXPECT_EQ(r.exit_code, 75) << r.output;
  EXPECT_NE(r.output.find("FT test: rank 0 stalls before iteration 3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("FT: rank 1: section 'step' has been open for "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("more than its timeout of 1.00 s (--ft-param-rank_section_timeouts); the rank is "
                          "considered hung: ending the job with exit code 75"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("FT: rank 0:"), std::string::npos) << r.output;
  fs::remove_all(dir);
}

TEST(FtCli, OutOfSectionTimeoutInOneProcess) {
  const fs::path dir = temp_dir("oos");
  std::vector<std::string> env = kMpiEnv;
  env.push_back("GALE_FT_TEST_STALL=0:2");
  test::RunResult r = test::run_with_timeout(
      tiny_gpt_pretrain(1, 4,
                        {"--enable-ft-package", "--save", dir.string(), "--save-interval", "100", "--ft-param-rank_out_of_section_timeout", "1", "--ft-num-warmup-iters", "1",
                         "--ft-param-workload_check_interval", "0.1"},
                        {}),
      env, 120);
  ASSERT_FALSE(r.timed_out) << r.output;
  EXPECT_EQ(r.exit_code, 75) << r.output;
  EXPECT_NE(r.output.find("FT: rank 0: has been out of any section for "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("more than the out-of-section timeout of 1.00 s"), std::string::npos) << r.output;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace gale
