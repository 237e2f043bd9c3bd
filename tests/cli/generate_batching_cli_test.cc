// `gale generate` with Megatron's inference flags: --prompts-file under static batching
// (--inference-max-requests), dynamic batching (--inference-dynamic-batching and its buffer flags)
// and --flash-decode prints, for every prompt, the text of generating it alone with --prompt
// (greedy, and sampling with the same --seed), with a throughput line; and each flag's errors.
#include <gtest/gtest.h>

#include <regex>

#include "data/data_test_util.h"
#include "generate_cli_fixture.h"
#include "subprocess.h"

namespace gale {
namespace {

using testing::TempDir;
using testing::write_file;

std::vector<std::string> command(const std::string& sub, std::vector<std::string> extra) {
  std::vector<std::string> argv = {GALE_BINARY, sub, "--num-layers", "2", "--hidden-size", "64",
                                   "--num-attention-heads", "4", "--seq-length", "32", "--max-position-embeddings",
                                   "64"};
  for (const std::vector<std::string>& more : {testing::gpt2_tokenizer_flags(), extra})
    argv.insert(argv.end(), more.begin(), more.end());
  return argv;
}

const std::vector<std::string>& kPrompts = testing::kMixedLengthPrompts;

class GenerateBatchingCli : public testing::TrainedCheckpointCli<command> {
 protected:
  static test::RunResult generate(std::vector<std::string> extra) {
    std::vector<std::string> a = {"--load", dir_->file("ckpt"), "--max-new-tokens", "12"};
    a.insert(a.end(), extra.begin(), extra.end());
    return test::run_with_timeout(command("generate", a), {"OMP_NUM_THREADS=1"}, 120);
  }
  // The texts: the output without the throughput line (stderr, so anywhere in the merged output).
  static std::string texts(const test::RunResult& r, std::string* stats) {
    static const std::regex line(R"(\[[^\]\n]*tokens/s[^\]\n]*\]\n)");
    std::smatch m;
    if (std::regex_search(r.output, m, line) && stats) *stats = m.str();
    return std::regex_replace(r.output, line, "");
  }
  // Every prompt alone with --prompt, concatenated.
  static std::string one_at_a_time(const std::vector<std::string>& sampling) {
    std::string all;
    for (const std::string& p : kPrompts) {
      std::vector<std::string> a = {"--prompt", p};
      a.insert(a.end(), sampling.begin(), sampling.end());
      const test::RunResult r = generate(a);
      EXPECT_EQ(r.exit_code, 0) << r.output;
      all += texts(r, nullptr);
    }
    return all;
  }
};

// Dynamic batching with a tiny buffer: blocks of 8 positions, 602 blocks (the 64 guaranteed
// requests of 64 positions reserve 512), at most 64 tokens a step.
const std::vector<std::string> kDynamic = {"--inference-dynamic-batching", "--inference-dynamic-batching-buffer-size-gb",
                                           "0.0046", "--inference-max-seq-length", "64",
                                           "--inference-dynamic-batching-block-size", "8",
                                           "--inference-dynamic-batching-max-tokens-override", "64"};

TEST_F(GenerateBatchingCli, GreedyBatchesGiveTheTokensOfEachPromptAlone) {
  ASSERT_EQ(trained_->exit_code, 0) << trained_->output;
  const std::string alone = one_at_a_time({"--temperature", "0"});
  ASSERT_FALSE(alone.empty());
  std::string stats;
  test::RunResult r = generate({"--prompts-file", prompts(), "--temperature", "0", "--inference-max-requests", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(texts(r, &stats), alone);
  EXPECT_TRUE(std::regex_search(stats, std::regex(R"(^\[6 requests, \d+ prompt tokens, \d+ generated, [0-9.]+ tokens/s, )"
                                                  R"(static batching: \d+ steps, batches of up to 2 requests, peak KV )"
                                                  R"(bytes 131072\]\n$)")))  // 2 requests x 64 positions x 2 layers x 2·64 floats x 4 bytes
      << stats;
  std::vector<std::string> dyn = kDynamic;
  dyn.insert(dyn.end(), {"--prompts-file", prompts(), "--temperature", "0"});
  r = generate(dyn);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(texts(r, &stats), alone);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(stats, m, std::regex(R"(dynamic batching: \d+ steps, up to \d+ requests a step, )"
                                                     R"((\d+) joined mid-flight, (\d+) pauses, max requests 64, max )"
                                                     R"(tokens 64, peak KV bytes \d+ of a 4931584-byte buffer \(602 )"
                                                     R"(blocks of 8 positions\), 602 blocks free at the end\])")))
      << stats;
  EXPECT_GT(std::stoi(m[1]), 0) << stats;
  EXPECT_GT(std::stoi(m[2]), 0) << stats;
  r = generate({"--prompts-file", prompts(), "--temperature", "0", "--flash-decode", "--flash-decode-chunk-size", "5"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(texts(r, nullptr), alone) << "--flash-decode, static batching";
}

// Every request samples its step k with the draws of step k of a one-prompt run of the same --seed,
// so batched sampling reproduces the one-at-a-time samples (Megatron draws from one torch generator
// for the whole batch and does not promise this).
TEST_F(GenerateBatchingCli, SamplingWithASeedIsTheSameBatchedAndAlone) {
  ASSERT_EQ(trained_->exit_code, 0) << trained_->output;
  const std::vector<std::string> sampling = {"--temperature", "0.9", "--top-k", "40", "--seed", "11"};
  const std::string alone = one_at_a_time(sampling);
  std::vector<std::string> dyn = kDynamic;
  dyn.insert(dyn.end(), {"--prompts-file", prompts(), "--flash-decode"});
  dyn.insert(dyn.end(), sampling.begin(), sampling.end());
  const test::RunResult r = generate(dyn);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(texts(r, nullptr), alone);
}

TEST_F(GenerateBatchingCli, EachFlagsErrors) {
  ASSERT_EQ(trained_->exit_code, 0) << trained_->output;
  const std::string p = prompts();
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--prompt", "x", "--inference-batch-times-seqlen-threshold", "512"},
       "--inference-batch-times-seqlen-threshold 512: requires --pipeline-model-parallel-size > 1 (Megatron's check); "
       "gale generate runs the whole model in one process"},
      {{"--prompts-file", p, "--inference-max-requests", "0"},
       "--inference-max-requests: expected a positive integer, found 0"},
      {{"--prompt", "Once upon a time", "--inference-max-seq-length", "10"},
       "--inference-max-seq-length 10: maximum allowed sequence length was set to 10 tokens but requested generation "
       "of 16 tokens (a prompt of 4 + --max-new-tokens 12)"},
      {{"--prompts-file", p, "--max-tokens-to-oom", "100", "--inference-max-requests", "4"},
       "--max-tokens-to-oom 100: too many tokens. "},
      {{"--prompt", "x", "--flash-decode-chunk-size", "8"}, "--flash-decode-chunk-size needs --flash-decode"},
      {{"--prompts-file", p, "--inference-dynamic-batching-buffer-size-gb", "1"},
       "--inference-dynamic-batching-buffer-size-gb needs --inference-dynamic-batching"},
      {{"--prompts-file", p, "--inference-dynamic-batching", "--inference-max-requests", "4"},
       "--inference-max-requests with --inference-dynamic-batching: dynamic batching sizes its requests from the "
       "buffer"},
      {{"--prompts-file", p, "--inference-dynamic-batching", "--num-beams", "2"},
       "--num-beams 2 with --inference-dynamic-batching: beam search of batched requests is not supported yet"},
      {{"--prompts-file", p, "--stream"}, "--stream with --prompts-file: streaming batched requests is not supported yet"},
      {{"--prompts-file", p, "--prompt", "x"}, "--prompt with --prompts-file: give the prompts in the file"},
      {{"--prompts-file", p, "--inference-dynamic-batching", "--inference-dynamic-batching-buffer-size-gb", "1e-7"},
       "--inference-dynamic-batching-buffer-size-gb 1e-07: 107 bytes, less than one KV block of 256 positions"},
      {{"--prompts-file", p, "--inference-dynamic-batching", "--inference-dynamic-batching-buffer-size-gb", "0.001"},
       "holds no request of --inference-max-seq-length 2560 positions"},
      {{"--prompts-file", p, "--inference-dynamic-batching", "--inference-dynamic-batching-buffer-size-gb", "0.002",
        "--inference-max-seq-length", "64"},  // 8 blocks of 256 positions: 32 requests of 64
       "--inference-dynamic-batching-buffer-guaranteed-fraction 0.2: gtd_request_count (64) > max_requests (32)"},
      {{"--prompts-file", dir_->file("missing.txt")}, "--prompts-file: cannot open"},
  };
  for (const auto& [args, message] : cases) {
    const test::RunResult r = generate(args);
    EXPECT_EQ(r.exit_code, 2) << args[0] << " " << args[1] << ": " << r.output;
    EXPECT_EQ(r.output.rfind("gale generate: error: ", 0), 0u) << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
  }
}

}  // namespace
}  // namespace gale
