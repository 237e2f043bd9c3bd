// `gale generate` and `gale evaluate` on a hybrid checkpoint with Gated DeltaNet layers ('G',
// `gale pretrain --is-hybrid-model --hybrid-override-pattern MG-*`): every prompt alone (Mamba and GDN
// decoding states, model/mamba_state.h), the same prompts under static and dynamic batching, and the
// model from the checkpoint's args (--use-checkpoint-args: the --linear-* sizes are recorded) give the
// same greedy texts; perplexity runs; a checkpoint whose args lack the sizes, and conversion to
// Megatron's format, are refused in one line. (Decoding = a full forward, scoring = the training loss:
// tests/train/hybrid_gdn_inference_test.cc.)
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>

#include "data/data_test_util.h"
#include "generate_cli_fixture.h"
#include "subprocess.h"

namespace gale {
namespace {

using testing::TempDir;
using testing::write_file;

// 4 layers M G - *, hidden 64 (Mamba: 8 heads of 16, 2 groups, d_state 16; GDN: 2 key heads of 16,
// 4 value heads of 16, conv 4), SwiGLU, RMSNorm, no position embedding, GPT-2's tokenizer.
std::vector<std::string> command(const std::string& sub, std::vector<std::string> extra) {
  std::vector<std::string> argv = {
      GALE_BINARY, sub, "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
      "--max-position-embeddings", "64", "--is-hybrid-model", "--hybrid-override-pattern", "MG-*",
      "--mamba-state-dim", "16", "--mamba-head-dim", "16", "--mamba-num-groups", "2", "--normalization", "RMSNorm",
      "--position-embedding-type", "none", "--swiglu", "--linear-num-key-heads", "2", "--linear-num-value-heads", "4",
      "--linear-key-head-dim", "16", "--linear-value-head-dim", "16"};
  for (const std::vector<std::string>& more : {testing::gpt2_tokenizer_flags(), extra})
    argv.insert(argv.end(), more.begin(), more.end());
  return argv;
}

const std::vector<std::string>& kPrompts = testing::kMixedLengthPrompts;

class HybridGdnGenerateCli : public testing::TrainedCheckpointCli<command> {
 protected:
  static test::RunResult run(const std::string& sub, std::vector<std::string> extra) {
    std::vector<std::string> a = {"--load", dir_->file("ckpt")};
    a.insert(a.end(), extra.begin(), extra.end());
    return test::run_with_timeout(command(sub, a), {"OMP_NUM_THREADS=1"}, 300);
  }
  // `gale <sub>` with the model from the checkpoint `ckpt`'s args.
  static test::RunResult run_own(const std::string& sub, const std::string& ckpt, std::vector<std::string> extra) {
    std::vector<std::string> argv = {GALE_BINARY, sub, "--load", ckpt, "--use-checkpoint-args"};
    for (const std::vector<std::string>& more : {testing::gpt2_tokenizer_flags(), extra})
      argv.insert(argv.end(), more.begin(), more.end());
    return test::run_with_timeout(argv, {"OMP_NUM_THREADS=1"}, 300);
  }
  static std::string texts(const test::RunResult& r) {
    static const std::regex line(R"(\[[^\]\n]*(tokens/s|decoding states)[^\]\n]*\]\n)");
    return std::regex_replace(r.output, line, "");
  }
};

TEST_F(HybridGdnGenerateCli, GreedyAloneBatchedAndFromTheCheckpointArgsGiveTheSameTexts) {
  ASSERT_EQ(trained_->exit_code, 0) << trained_->output;
  std::string alone;
  for (const std::string& p : kPrompts) {
    const test::RunResult r = run("generate", {"--prompt", p, "--temperature", "0", "--max-new-tokens", "12"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string text = texts(r);
    EXPECT_EQ(text.rfind(p, 0), 0u) << "the prompt, then its continuation: " << r.output;
    EXPECT_GT(text.size(), p.size() + 1) << r.output;
    alone += text;
  }
  const test::RunResult own = run_own("generate", dir_->file("ckpt"),
                                      {"--prompts-file", prompts(), "--temperature", "0", "--max-new-tokens", "12",
                                       "--inference-max-requests", "2"});
  ASSERT_EQ(own.exit_code, 0) << own.output;
  EXPECT_EQ(texts(own), alone);
  const test::RunResult dyn = run("generate", {"--prompts-file", prompts(), "--temperature", "0", "--max-new-tokens",
                                               "12", "--inference-dynamic-batching",
                                               "--inference-dynamic-batching-buffer-size-gb", "0.0023",
                                               "--inference-max-seq-length", "64",
                                               "--inference-dynamic-batching-block-size", "8",
                                               "--inference-dynamic-batching-max-tokens-override", "64"});
  ASSERT_EQ(dyn.exit_code, 0) << dyn.output;
  EXPECT_EQ(texts(dyn), alone);
  // Perplexity: the same loss with the flags and from the checkpoint's args.
  TempDir data;
  write_file(data.file("docs.jsonl"), "{\"text\": \"It is a truth universally acknowledged.\"}\n");
  const test::RunResult e = run("evaluate", {"--task", "ppl", "--task-data-path", data.file("docs.jsonl")});
  const test::RunResult e_own =
      run_own("evaluate", dir_->file("ckpt"), {"--task", "ppl", "--task-data-path", data.file("docs.jsonl")});
  ASSERT_EQ(e.exit_code, 0) << e.output;
  ASSERT_EQ(e_own.exit_code, 0) << e_own.output;
  std::smatch m, m_own;
  const std::regex loss(R"(\| lm loss: ([0-9.E+-]+) \|)");
  ASSERT_TRUE(std::regex_search(e.output, m, loss)) << e.output;
  ASSERT_TRUE(std::regex_search(e_own.output, m_own, loss)) << e_own.output;
  EXPECT_EQ(m[1], m_own[1]);
  const double l = std::stod(m[1]);
  EXPECT_TRUE(std::isfinite(l) && l > 0.0 && l < std::log(50304.0) + 1.0) << e.output;
}

TEST_F(HybridGdnGenerateCli, OldArgsAndConversionAreRefused) {
  ASSERT_EQ(trained_->exit_code, 0) << trained_->output;
  // A copy whose args lack linear_num_value_heads, as checkpoints saved before Gale recorded the sizes.
  TempDir old;
  std::filesystem::copy(dir_->file("ckpt"), old.file("ckpt"), std::filesystem::copy_options::recursive);
  const std::string meta = old.file("ckpt") + "/iter_0000004/metadata.json";
  nlohmann::json j;
  {
    std::ifstream in(meta);
    ASSERT_TRUE(in.good()) << meta;
    in >> j;
  }
  ASSERT_EQ(j["args"].at("linear_num_value_heads"), 4);
  j["args"].erase("linear_num_value_heads");
  write_file(meta, j.dump());
  const test::RunResult r = run_own("generate", old.file("ckpt"), {"--prompt", "x", "--max-new-tokens", "2"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("metadata.json: args has no 'linear_num_value_heads' for the Gated DeltaNet layers ('G') "
                          "of hybrid_override_pattern 'MG-*'"),
            std::string::npos)
      << r.output;
  // The same checkpoint with the model flags on the command line still loads.
  std::vector<std::string> flags = command("generate", {"--load", old.file("ckpt"), "--prompt", "x",
                                                        "--max-new-tokens", "2"});
  EXPECT_EQ(test::run_with_timeout(flags, {"OMP_NUM_THREADS=1"}, 300).exit_code, 0);
  // --linear-* sizes without 'G' layers are refused as gale pretrain refuses them.
  std::vector<std::string> no_g = command("generate", {"--load", dir_->file("ckpt"), "--prompt", "x"});
  for (std::string& a : no_g)
    if (a == "MG-*") a = "MM-*";
  const test::RunResult ng = test::run_with_timeout(no_g, {}, 60);
  EXPECT_EQ(ng.exit_code, 2) << ng.output;
  EXPECT_NE(ng.output.find("needs Gated DeltaNet layers ('G') in --hybrid-override-pattern"), std::string::npos)
      << ng.output;
  TempDir out;
  const test::RunResult c = test::run_with_timeout({GALE_BINARY, "convert", "--load-model-type", "gale",
                                                    "--save-model-type", "megatron", "--load-dir", dir_->file("ckpt"),
                                                    "--save-dir", out.file("mg")},
                                                   {}, 60);
  EXPECT_NE(c.exit_code, 0);
  EXPECT_NE(c.output.find("a hybrid model with Gated DeltaNet layers ('G' in hybrid_override_pattern 'MG-*'): "
                          "conversion to or from Megatron's and Hugging Face's formats is not supported yet"),
            std::string::npos)
      << c.output;
}

}  // namespace
}  // namespace gale
