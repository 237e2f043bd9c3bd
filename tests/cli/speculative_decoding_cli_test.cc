// `gale generate --num-speculative-tokens N` on a checkpoint trained 30 steps with --mtp-num-layers 2: the
// texts of N = 1, 2 are those of N = 0 (greedy and seeded sampling; --prompts-file with static and
// dynamic batching, and one --prompt), with the accepted-drafts line on stderr; the refusals (a
// model without MTP layers, N above them, beams, streaming, chat, N ≥ the block size) are one-line
// usage errors naming the flag.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "subprocess.h"

namespace gale {
namespace {

class GaleGenerateSpeculative : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::filesystem::temp_directory_path() / ("gale_specdec_ckpt_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    std::vector<std::string> argv = {
        GALE_BINARY, "pretrain", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
        "--seq-length", "32", "--max-position-embeddings", "64", "--micro-batch-size", "2", "--global-batch-size",
        "4", "--train-iters", "30", "--lr", "3e-3", "--mock-data", "--vocab-size", "4096", "--log-interval", "1",
        "--eval-iters", "0", "--num-threads", "1", "--swiglu", "--normalization", "RMSNorm",
        "--position-embedding-type", "rope", "--disable-bias-linear", "--untie-embeddings-and-output-weights",
        "--mtp-num-layers", "2", "--save", dir_.string(), "--save-interval", "30"};
    const test::RunResult r = test::run_with_timeout(argv, {}, 300);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    prompts_ = dir_ / "prompts.txt";
    std::ofstream(prompts_) << "5 17 300 2 41\n7\n9 9 1 400 3 3 8 100 2\n1 2 3 4\n";
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(dir_); }
  static test::RunResult generate(std::vector<std::string> extra) {
    std::vector<std::string> argv = {GALE_BINARY, "generate", "--load", dir_.string(), "--use-checkpoint-args",
                                     "--max-new-tokens", "12", "--tokenizer-type", "NullTokenizer",
                                     "--vocab-size", "4096"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return test::run_with_timeout(argv, {}, 300);
  }
  // The printed texts (stdout lines without the bracketed stderr lines).
  static std::string texts(const std::string& output) {
    std::string out;
    std::istringstream in(output);
    for (std::string line; std::getline(in, line);)
      if (!line.empty() && line[0] != '[') out += line + "\n";
    return out;
  }
  static std::filesystem::path dir_, prompts_;
};
std::filesystem::path GaleGenerateSpeculative::dir_, GaleGenerateSpeculative::prompts_;

TEST_F(GaleGenerateSpeculative, TextsAreThoseWithoutDrafts) {
  const std::regex accepted(
      R"(\[speculative decoding: (\d) tokens a step from 2 MTP layers, (\d+) of (\d+) drafts accepted)");
  for (const std::vector<std::string>& mode :
       {std::vector<std::string>{"--prompts-file", prompts_.string(), "--temperature", "0"},
        std::vector<std::string>{"--prompts-file", prompts_.string(), "--temperature", "0.8", "--top-k", "20",
                                 "--seed", "7"},
        std::vector<std::string>{"--prompts-file", prompts_.string(), "--temperature", "0",
                                 "--inference-dynamic-batching", "--inference-dynamic-batching-block-size", "4",
                                 "--inference-dynamic-batching-buffer-size-gb", "0.01",
                                 "--inference-max-seq-length", "64"},
        std::vector<std::string>{"--prompt", "5 17 300 2 41", "--temperature", "0"}}) {
    const test::RunResult plain = generate(mode);
    ASSERT_EQ(plain.exit_code, 0) << plain.output;
    EXPECT_EQ(plain.output.find("speculative"), std::string::npos) << plain.output;
    for (const char* n : {"1", "2"}) {
      std::vector<std::string> argv = mode;
      argv.insert(argv.end(), {"--num-speculative-tokens", n});
      const test::RunResult r = generate(argv);
      ASSERT_EQ(r.exit_code, 0) << r.output;
      EXPECT_EQ(texts(r.output), texts(plain.output)) << mode[0] << " " << mode[2] << " N " << n;
      std::smatch m;
      ASSERT_TRUE(std::regex_search(r.output, m, accepted)) << r.output;
      EXPECT_EQ(m[1].str(), n);
      EXPECT_LE(std::stoll(m[2].str()), std::stoll(m[3].str()));
      EXPECT_GT(std::stoll(m[3].str()), 0) << r.output;
      // 30 steps on Megatron's mock documents (1, 2, 3, ...) teach the MTP layers to count on:
      // greedy drafts are accepted where the text counts up.
      if (mode[0] == "--prompts-file" && mode[3] == "0") EXPECT_GT(std::stoll(m[2].str()), 0) << r.output;
    }
  }
}

TEST_F(GaleGenerateSpeculative, RefusalsAreOneLineUsageErrors) {
  struct Case {
    std::vector<std::string> argv;
    std::string error;
  };
  const std::vector<Case> cases = {
      {{"--prompt", "5 17", "--num-speculative-tokens", "3"},
       "--num-speculative-tokens 3: must be less than or equal to the number of MTP layers (--mtp-num-layers 2)"},
      {{"--prompt", "5 17", "--num-speculative-tokens", "-1"},
       "--num-speculative-tokens: expected a non-negative integer, found -1"},
      {{"--prompt", "5 17", "--num-speculative-tokens", "1", "--num-beams", "2"},
       "--num-speculative-tokens 1 with --num-beams 2: speculative decoding drafts one sequence per request"},
      {{"--prompt", "5 17", "--num-speculative-tokens", "1", "--stream"},
       "--num-speculative-tokens 1 with --stream: not supported yet"},
      {{"--task", "chat", "--num-speculative-tokens", "1"}, "--num-speculative-tokens 1 with --task chat"},
      {{"--prompts-file", prompts_.string(), "--num-speculative-tokens", "2", "--inference-dynamic-batching",
        "--inference-dynamic-batching-block-size", "2", "--inference-dynamic-batching-buffer-size-gb", "0.01",
        "--inference-max-seq-length", "64"},
       "--num-speculative-tokens (2) must be < --inference-dynamic-batching-block-size (2)"},
  };
  for (const Case& c : cases) {
    const test::RunResult r = generate(c.argv);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("gale generate: error: " + c.error), std::string::npos) << r.output;
  }
  // The model flags without --mtp-num-layers: a model without MTP layers.
  std::vector<std::string> argv = {GALE_BINARY, "generate", "--load", dir_.string(), "--num-layers", "2",
                                   "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
                                   "--max-position-embeddings", "64", "--swiglu", "--normalization", "RMSNorm",
                                   "--position-embedding-type", "rope", "--disable-bias-linear",
                                   "--untie-embeddings-and-output-weights", "--tokenizer-type", "NullTokenizer",
                                   "--vocab-size", "4096", "--prompt", "5 17", "--num-speculative-tokens", "1"};
  const test::RunResult r = test::run_with_timeout(argv, {}, 300);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("gale generate: error: --num-speculative-tokens 1 needs a model with multi-token "
                          "prediction layers (--mtp-num-layers, as the checkpoint was trained with); found none"),
            std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace gale
