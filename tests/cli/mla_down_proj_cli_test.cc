// `gale pretrain --mla-down-proj-fusion`: the features manager reports and installs the fused MLA
// down projection; its losses equal the unfused run's (level 0, no flag); a checkpoint saved by the
// fused run resumes in an unfused run (and the other way round) with the uninterrupted run's losses.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>

#include "subprocess.h"

namespace gale {
namespace {

std::vector<std::string> deepseek(std::vector<std::string> extra) {
  std::vector<std::string> argv = {
      GALE_BINARY, "pretrain", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
      "--seq-length", "32", "--max-position-embeddings", "64", "--micro-batch-size", "2", "--global-batch-size", "4",
      "--train-iters", "6", "--lr", "3e-3", "--mock-data", "--vocab-size", "4096", "--log-interval", "1",
      "--eval-iters", "0", "--num-threads", "1", "--swiglu", "--normalization", "RMSNorm",
      "--position-embedding-type", "rope", "--disable-bias-linear", "--untie-embeddings-and-output-weights",
      "--attention-dropout", "0.0", "--hidden-dropout", "0.0", "--multi-latent-attention", "--q-lora-rank", "24",
      "--kv-lora-rank", "16", "--qk-head-dim", "16", "--qk-pos-emb-head-dim", "8", "--v-head-dim", "16",
      "--qk-layernorm"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

std::vector<double> losses(const std::string& output) {
  std::vector<double> out;
  std::regex re("\\| lm loss: ([0-9.E+-]+) \\|");
  for (std::sregex_iterator it(output.begin(), output.end(), re), end; it != end; ++it) out.push_back(std::stod((*it)[1]));
  return out;
}

TEST(GalePretrainMlaDownProjFusion, ActiveAndTheUnfusedLosses) {
  test::RunResult fused = test::run_with_timeout(deepseek({"--mla-down-proj-fusion"}), {}, 300);
  ASSERT_EQ(fused.exit_code, 0) << fused.output;
  EXPECT_NE(fused.output.find("active: mla-down-proj-fusion (fused compute, level 2)"), std::string::npos)
      << fused.output;
  test::RunResult plain = test::run_with_timeout(deepseek({"--optimization-level", "0"}), {}, 300);
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  const std::vector<double> a = losses(fused.output), b = losses(plain.output);
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_NEAR(a[i], b[i], 1e-5 * b[i]) << "iteration " << i + 1;
}

class GalePretrainMlaDownProjResume : public ::testing::TestWithParam<bool> {};

// GetParam(): the first half runs fused and the second unfused (else the reverse).
TEST_P(GalePretrainMlaDownProjResume, ContinuesTheUninterruptedRun) {
  const bool fused_first = GetParam();
  const std::vector<std::string> fused = {"--mla-down-proj-fusion"}, unfused = {};
  auto dir = std::filesystem::temp_directory_path() /
             ("gale_mla_fuse_ckpt_" + std::to_string(::getpid()) + (fused_first ? "_f" : "_u"));
  std::filesystem::remove_all(dir);
  test::RunResult whole = test::run_with_timeout(deepseek(fused_first ? fused : unfused), {}, 300);
  std::vector<std::string> first_flags = fused_first ? fused : unfused;
  first_flags.insert(first_flags.end(), {"--save", dir.string(), "--save-interval", "3", "--exit-interval", "3"});
  test::RunResult first = test::run_with_timeout(deepseek(first_flags), {}, 300);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  std::vector<std::string> second_flags = fused_first ? unfused : fused;
  second_flags.insert(second_flags.end(), {"--load", dir.string()});
  test::RunResult second = test::run_with_timeout(deepseek(second_flags), {}, 300);
  ASSERT_EQ(second.exit_code, 0) << second.output;
  const std::vector<double> a = losses(whole.output), b = losses(second.output);
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(a[3 + i], b[i], 1e-5 * a[3 + i]) << "iteration " << 4 + i;
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Direction, GalePretrainMlaDownProjResume, ::testing::Bool(),
                         [](const auto& info) { return std::string(info.param ? "fused_then_unfused" : "unfused_then_fused"); });

}  // namespace
}  // namespace gale
