// `gale generate` on a heterogeneous-layers checkpoint (--heterogeneous-layers-config-encoded-json):
// one prompt decodes with the layers' own KV caches, and the batched engine, whose key/value blocks
// have one width for every layer, is refused in one line naming the flag and the layer.
#include <gtest/gtest.h>

#include "data/data_test_util.h"
#include "generate_cli_fixture.h"
#include "subprocess.h"

namespace gale {
namespace {

using testing::TempDir;
using testing::write_file;

const char* kBlocks = R"({"block_configs": [
  {"attention": {"n_heads_in_group": 4}, "ffn": {"ffn_hidden_size": 48}},
  {"attention": {"no_op": true}, "ffn": {"replace_with_linear": true}},
  {"attention": {"n_heads_in_group": 2}, "ffn": {"ffn_mult": 1.0}}]})";

std::vector<std::string> pretrain(std::vector<std::string> extra) {
  std::vector<std::string> argv = {GALE_BINARY, "pretrain", "--num-layers", "3", "--hidden-size", "64",
                                   "--num-attention-heads", "4", "--group-query-attention", "--num-query-groups", "2",
                                   "--seq-length", "32", "--max-position-embeddings", "64", "--normalization",
                                   "RMSNorm", "--swiglu", "--position-embedding-type", "rope",
                                   "--heterogeneous-layers-config-encoded-json", kBlocks};
  for (const std::vector<std::string>& more : {testing::gpt2_tokenizer_flags(), extra})
    argv.insert(argv.end(), more.begin(), more.end());
  return argv;
}

// gale generate rebuilds the layers from the checkpoint's args (the JSON is recorded there).
std::vector<std::string> generate(const std::string& ckpt, std::vector<std::string> extra) {
  std::vector<std::string> argv = {GALE_BINARY, "generate", "--load", ckpt, "--use-checkpoint-args"};
  for (const std::vector<std::string>& more : {testing::gpt2_tokenizer_flags(), extra})
    argv.insert(argv.end(), more.begin(), more.end());
  return argv;
}

TEST(HeterogeneousGenerateCli, OnePromptDecodesBatchedDecodingIsRefused) {
  TempDir dir;
  const test::RunResult trained = test::run_with_timeout(
      pretrain({"--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", "2", "--lr", "1e-3",
                           "--mock-data", "--eval-iters", "0", "--num-threads", "1", "--save", dir.file("ckpt"),
                           "--save-interval", "2"}),
      {"OMP_NUM_THREADS=1"}, 300);
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const test::RunResult one = test::run_with_timeout(
      generate(dir.file("ckpt"), {"--prompt", "Once upon a time", "--temperature", "0", "--max-new-tokens", "6"}),
      {"OMP_NUM_THREADS=1"}, 300);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_NE(one.output.find("Once upon a time"), std::string::npos) << one.output;
  write_file(dir.file("prompts.txt"), "Hello\nOnce upon a time\n");
  for (const std::vector<std::string>& batched :
       {std::vector<std::string>{"--prompts-file", dir.file("prompts.txt")},
        std::vector<std::string>{"--prompts-file", dir.file("prompts.txt"), "--inference-dynamic-batching"}}) {
    std::vector<std::string> extra = {"--temperature", "0", "--max-new-tokens", "6"};
    extra.insert(extra.end(), batched.begin(), batched.end());
    const test::RunResult r =
        test::run_with_timeout(generate(dir.file("ckpt"), extra), {"OMP_NUM_THREADS=1"}, 300);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    const std::string flag = batched.size() == 2 ? "--prompts-file" : "--inference-dynamic-batching";
    EXPECT_NE(r.output.find(flag + " with heterogeneous layers (--heterogeneous-layers-config-*): not supported yet "
                                   "(layer 0 has its own attention or MLP"),
              std::string::npos)
        << r.output;
  }
}

}  // namespace
}  // namespace gale
