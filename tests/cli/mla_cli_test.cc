// `gale pretrain` with --multi-latent-attention: a falling loss on the mock data, the same losses at
// optimisation levels 0 and 2 (flash attention) and, within bf16's precision, with --bf16; save and
// resume continue the same run; `gale generate --use-checkpoint-args` reads the MLA flags back from
// the checkpoint (YaRN included); --cache-mla-latents and conversion to Hugging Face are refused in
// one line.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>

#include "subprocess.h"

namespace gale {
namespace {

// A tiny DeepSeek-style model: query and key/value latents with their norms, RMSNorm, SwiGLU.
std::vector<std::string> deepseek(const char* command, std::vector<std::string> extra) {
  std::vector<std::string> argv = {
      GALE_BINARY, command, "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
      "--seq-length", "32", "--max-position-embeddings", "64", "--micro-batch-size", "2", "--global-batch-size", "4",
      "--train-iters", "6", "--lr", "3e-3", "--mock-data", "--vocab-size", "4096", "--log-interval", "1",
      "--eval-iters", "0", "--num-threads", "1", "--swiglu", "--normalization", "RMSNorm",
      "--position-embedding-type", "rope", "--disable-bias-linear", "--untie-embeddings-and-output-weights",
      "--attention-dropout", "0.0", "--hidden-dropout", "0.0", "--multi-latent-attention", "--q-lora-rank", "24",
      "--kv-lora-rank", "16", "--qk-head-dim", "16", "--qk-pos-emb-head-dim", "8", "--v-head-dim", "16",
      "--qk-layernorm", "--rotary-scaling-factor", "4", "--mscale", "1", "--mscale-all-dim", "1"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

std::vector<double> losses(const std::string& output) {
  std::vector<double> out;
  std::regex re("\\| lm loss: ([0-9.E+-]+) \\|");
  for (std::sregex_iterator it(output.begin(), output.end(), re), end; it != end; ++it) out.push_back(std::stod((*it)[1]));
  return out;
}

TEST(GalePretrainMla, LearnsWithTheSameLossesAtLevels0And2AndWithBf16) {
  auto run = [&](std::vector<std::string> flags) {
    test::RunResult r = test::run_with_timeout(deepseek("pretrain", flags), {}, 300);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return losses(r.output);
  };
  const std::vector<double> l0 = run({"--optimization-level", "0"});
  const std::vector<double> l2 = run({"--use-flash-attn", "--use-fused-rmsnorm", "--use-fused-swiglu",
                                      "--use-fused-rotary-pos-emb", "--cross-entropy-loss-fusion"});
  const std::vector<double> bf16 = run({"--bf16"});
  ASSERT_EQ(l0.size(), 6u);
  ASSERT_EQ(l2.size(), 6u);
  ASSERT_EQ(bf16.size(), 6u);
  EXPECT_LT(l0.back(), l0.front() - 0.1);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_NEAR(l2[i], l0[i], 1e-4 * l0[i]) << "iteration " << i + 1;
    EXPECT_NEAR(bf16[i], l0[i], 1e-2 * l0[i]) << "iteration " << i + 1;
  }
}

TEST(GalePretrainMla, SaveThenResumeContinuesTheSameRunAndGenerateReadsIt) {
  auto dir = std::filesystem::temp_directory_path() / ("gale_mla_ckpt_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  test::RunResult whole = test::run_with_timeout(deepseek("pretrain", {}), {}, 300);
  test::RunResult first = test::run_with_timeout(
      deepseek("pretrain", {"--save", dir.string(), "--save-interval", "3", "--exit-interval", "3"}), {}, 300);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  test::RunResult second = test::run_with_timeout(deepseek("pretrain", {"--load", dir.string()}), {}, 300);
  ASSERT_EQ(second.exit_code, 0) << second.output;
  const std::vector<double> a = losses(whole.output), b = losses(second.output);
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(a[3 + i], b[i]) << "iteration " << 4 + i;

  // The checkpoint's args carry the MLA flags: generate builds the same model from them alone.
  test::RunResult gen = test::run_with_timeout(
      {GALE_BINARY, "generate", "--load", dir.string(), "--use-checkpoint-args", "--tokenizer-type", "NullTokenizer",
       "--vocab-size", "4096", "--prompt", "5 17 300 2 41", "--max-new-tokens", "6", "--temperature", "0"},
      {}, 300);
  ASSERT_EQ(gen.exit_code, 0) << gen.output;
  EXPECT_TRUE(std::regex_search(gen.output, std::regex(R"(5 17 300 2 41( \d+){6}\n)"))) << gen.output;
  // Not DeepseekV3ForCausalLM-shaped (transformers' YaRN needs 4096 x factor positions):
  // a one-line refusal, nothing half-written.
  test::RunResult hf = test::run_with_timeout({GALE_BINARY, "convert", "--load-model-type", "gale", "--save-model-type",
                                               "hf", "--load-dir", dir.string(), "--save-dir", (dir / "hf").string()},
                                              {}, 120);
  EXPECT_NE(hf.exit_code, 0) << hf.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "hf" / "config.json"));
  EXPECT_NE(hf.output.find(": a --multi-latent-attention model is written as DeepseekV3ForCausalLM only with "
                           "--max-position-embeddings = --rotary-scaling-factor x 4096 with YaRN"),
            std::string::npos)
      << hf.output;
  std::filesystem::remove_all(dir);
}

TEST(GalePretrainMla, UnsupportedCombinationsAreOneLineErrors) {
  test::RunResult r = test::run_with_timeout(deepseek("pretrain", {"--cache-mla-latents"}), {}, 60);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--cache-mla-latents: not supported yet"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace gale
