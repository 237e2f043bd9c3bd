// `gale generate --num-speculative-tokens N` on a Gated DeltaNet checkpoint (GDN then full attention,
// --linear-attention-freq 2) trained 30 steps with --mtp-num-layers 2: the GDN layers' states roll
// back past rejected drafts, so the greedy texts of N = 1, 2 are those of N = 0 (static and dynamic
// batching of prompts of different lengths), with drafts rejected along the way.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "subprocess.h"

namespace gale {
namespace {

// The printed texts (stdout lines without the bracketed stderr lines).
std::string texts(const std::string& output) {
  std::string out;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] != '[') out += line + "\n";
  return out;
}

TEST(GaleGenerateSpeculativeGdn, TextsAreThoseWithoutDrafts) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("gale_specdec_gdn_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const test::RunResult trained = test::run_with_timeout(
      {GALE_BINARY, "pretrain", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
       "--seq-length", "32", "--max-position-embeddings", "64", "--micro-batch-size", "2", "--global-batch-size", "4",
       "--train-iters", "30", "--lr", "3e-3", "--mock-data", "--vocab-size", "4096", "--log-interval", "10",
       "--eval-iters", "0", "--num-threads", "1", "--swiglu", "--normalization", "RMSNorm",
       "--position-embedding-type", "rope", "--disable-bias-linear", "--untie-embeddings-and-output-weights",
       "--mtp-num-layers", "2", "--experimental-attention-variant", "gdn", "--linear-attention-freq", "2",
       "--linear-num-key-heads", "2", "--linear-num-value-heads", "4", "--linear-key-head-dim", "16",
       "--linear-value-head-dim", "16", "--save", dir.string(), "--save-interval", "30"},
      {}, 300);
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const std::filesystem::path prompts = dir / "prompts.txt";
  std::ofstream(prompts) << "5 17 300 2 41\n7\n9 9 1 400 3 3 8 100 2\n1 2 3 4\n";
  const std::regex accepted(R"(\[speculative decoding: (\d) tokens a step from 2 MTP layers, (\d+) of (\d+) drafts)");
  for (const std::vector<std::string>& mode :
       {std::vector<std::string>{},
        std::vector<std::string>{"--inference-dynamic-batching", "--inference-dynamic-batching-block-size", "4",
                                 "--inference-dynamic-batching-buffer-size-gb", "0.01", "--inference-max-seq-length",
                                 "64"}}) {
    const auto generate = [&](const char* n) {
      std::vector<std::string> argv = {GALE_BINARY, "generate", "--load", dir.string(), "--use-checkpoint-args",
                                       "--max-new-tokens", "12", "--tokenizer-type", "NullTokenizer", "--vocab-size",
                                       "4096", "--prompts-file", prompts.string(), "--temperature", "0",
                                       "--num-speculative-tokens", n};
      argv.insert(argv.end(), mode.begin(), mode.end());
      return test::run_with_timeout(argv, {}, 300);
    };
    const test::RunResult plain = generate("0");
    ASSERT_EQ(plain.exit_code, 0) << plain.output;
    for (const char* n : {"1", "2"}) {
      const test::RunResult r = generate(n);
      ASSERT_EQ(r.exit_code, 0) << r.output;
      EXPECT_EQ(texts(r.output), texts(plain.output)) << "N " << n << (mode.empty() ? " static" : " dynamic");
      std::smatch m;
      ASSERT_TRUE(std::regex_search(r.output, m, accepted)) << r.output;
      EXPECT_LT(std::stoll(m[2].str()), std::stoll(m[3].str())) << "drafts rejected: the states rolled back";
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace gale
