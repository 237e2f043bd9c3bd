// `gale pretrain --automated-pipeline` at PP 2 under mpirun: the profile of both stages' layers is
// gathered into the policy file, the chosen split and recomputation are applied, the run's losses
// and gradient norms equal, as printed (7 significant digits; full recomputation is bit-exact, so
// nothing may differ), those of the same split given by hand with --num-layer-list, and a second run takes the policy from the
// file without profiling.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "mpi_cli.h"
#include "subprocess.h"

namespace gale {
namespace {

// 6 layers, hidden 64, sequence 128, 8 micro-batches of 2 per iteration: the activations weigh
// more than the parameters, so the memory limit bites.
test::RunResult run(std::vector<std::string> extra) {
  std::vector<std::string> argv = {
      GALE_BINARY, "pretrain", "--num-layers", "6", "--hidden-size", "64", "--num-attention-heads", "4",
      "--seq-length", "128", "--max-position-embeddings", "128", "--micro-batch-size", "2", "--global-batch-size",
      "16", "--train-iters", "3", "--lr", "3e-3", "--mock-data", "--vocab-size", "4096", "--eval-iters", "0",
      "--num-threads", "1", "--log-interval", "1", "--pipeline-model-parallel-size", "2"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return test::run_with_timeout(testing::launch_argv(2, argv, {}), testing::kMpiEnv, 300);
}

// The "| lm loss: ... |" and "| grad norm: ... |" fields of every logged iteration, as printed.
std::vector<std::string> printed_losses(const std::string& output) {
  std::vector<std::string> out;
  std::regex re("\\| (lm loss|grad norm): +([0-9.E+-]+) \\|");
  for (std::sregex_iterator it(output.begin(), output.end(), re), end; it != end; ++it) out.push_back((*it)[0]);
  return out;
}

std::string policy_line(const std::string& output, const std::string& label) {
  std::smatch m;
  if (!std::regex_search(output, m, std::regex(label + ": ([0-9,]+)"))) return "";
  return m[1];
}

int64_t rank0_peak(const std::string& output) {
  std::smatch m;
  if (!std::regex_search(output, m, std::regex("peak memory: .* \\(exact: ([0-9]+) bytes\\)"))) return -1;
  return std::stoll(m[1]);
}

TEST(GalePretrainAutomatedPipeline, ProfilesAppliesAndReusesThePolicy) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("gale_autopipe_cli_" + std::to_string(getpid()))).string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string config = dir + "/policy.json";

  const test::RunResult a = run({"--automated-pipeline", "--automated-pipeline-config", config});
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_NE(a.output.find("[automated pipeline] profiling 5 iterations at the even split (3,3)"), std::string::npos)
      << a.output;
  const std::string split = policy_line(a.output, "network layer setting \\(--num-layer-list\\)");
  const std::string recompute = policy_line(a.output, "recompute policy setting \\(first layers of each stage, full layers\\)");
  ASSERT_FALSE(split.empty()) << a.output;
  ASSERT_FALSE(recompute.empty()) << a.output;

  // The file: the profile holds every layer, measured on both stages and gathered (identical
  // layers keep identical bytes: exact allocator counts), and the policy printed.
  std::ifstream in(config);
  const nlohmann::json j = nlohmann::json::parse(in);
  ASSERT_EQ(j["policies"].size(), 1u);
  const nlohmann::json& e = j["policies"][0];
  const nlohmann::json& prof = e["profile"];
  ASSERT_EQ(prof["layer_kept_bytes"].size(), 6u);
  for (int l = 0; l < 6; ++l) {
    EXPECT_EQ(prof["layer_kept_bytes"][l], prof["layer_kept_bytes"][0]) << "layer " << l;
    EXPECT_EQ(prof["layer_input_bytes"][l], 128 * 2 * 64 * 4) << "layer " << l;  // [S·B, H] f32
    EXPECT_GT(prof["layer_kept_bytes"][l].get<int64_t>(), prof["layer_input_bytes"][l].get<int64_t>());
    EXPECT_EQ(prof["layer_static_bytes"][l], prof["layer_static_bytes"][0]) << "layer " << l;
    EXPECT_GT(prof["layer_forward_ms"][l].get<double>(), 0.0) << "layer " << l;
    EXPECT_GT(prof["layer_backward_ms"][l].get<double>(), 0.0) << "layer " << l;
  }
  EXPECT_GT(prof["embedding"]["static_bytes"].get<int64_t>(), 0);
  EXPECT_GT(prof["head"]["kept_bytes"].get<int64_t>(), 0);
  for (const auto& peak : prof["measured_peak_bytes"]) EXPECT_GT(peak.get<int64_t>(), 0);
  std::string file_split, file_recompute;
  for (const auto& n : e["num_layer_list"]) file_split += (file_split.empty() ? "" : ",") + std::to_string(n.get<int>());
  for (const auto& n : e["recompute_module_list"])
    file_recompute += (file_recompute.empty() ? "" : ",") + std::to_string(n.get<int>());
  EXPECT_EQ(file_split, split);
  EXPECT_EQ(file_recompute, recompute);
  if (e["predicted"]["feasible"].get<bool>())
    for (const auto& b : e["predicted"]["stage_memory_bytes"])
      EXPECT_LE(b.get<int64_t>(), e["predicted"]["memory_limit_bytes"].get<int64_t>());

  // The same split by hand: the same losses and gradient norms (recomputation is exact).
  const test::RunResult b = run({"--num-layer-list", split});
  ASSERT_EQ(b.exit_code, 0) << b.output;
  const std::vector<std::string> la = printed_losses(a.output), lb = printed_losses(b.output);
  ASSERT_EQ(la.size(), 6u) << a.output;
  EXPECT_EQ(la, lb);
  // Stage 0's recomputation lowers rank 0's peak below the hand-given split's without it.
  if (recompute.substr(0, recompute.find(',')) != "0") EXPECT_LT(rank0_peak(a.output), rank0_peak(b.output));

  // Again with the file: no profiling, the same policy and run.
  const test::RunResult c = run({"--automated-pipeline", "--automated-pipeline-config", config});
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_EQ(c.output.find("profiling 5 iterations"), std::string::npos) << c.output;
  EXPECT_NE(c.output.find("applied policy (from --automated-pipeline-config, no profiling)"), std::string::npos)
      << c.output;
  EXPECT_EQ(policy_line(c.output, "network layer setting \\(--num-layer-list\\)"), split);
  EXPECT_EQ(printed_losses(c.output), la);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace gale
