// `gale generate`, `gale evaluate` and `gale generate --task chat` on a hybrid Mamba checkpoint
// (`gale pretrain --is-hybrid-model`, layers M * - M): every prompt alone (the Mamba layers' decoding
// state, model/mamba_state.h) and the same prompts under static and dynamic batching give the same
// greedy texts, with the checkpoint's args too; sampling, beam search, chat and perplexity run; and
// what remains unsupported is refused in one line.
#include <gtest/gtest.h>

#include <cmath>
#include <regex>

#include "data/data_test_util.h"
#include "generate_cli_fixture.h"
#include "subprocess.h"

namespace gale {
namespace {

using testing::TempDir;
using testing::write_file;

// The model: 4 layers M * - M, hidden 64 (d_inner 128: 8 heads of 16, 2 groups, d_state 16), RMSNorm,
// no position embedding (as Megatron's Mamba examples), GPT-2's tokenizer.
std::vector<std::string> command(const std::string& sub, std::vector<std::string> extra) {
  std::vector<std::string> argv = {GALE_BINARY, sub, "--num-layers", "4", "--hidden-size", "64",
                                   "--num-attention-heads", "4", "--seq-length", "32", "--max-position-embeddings",
                                   "64", "--is-hybrid-model", "--hybrid-override-pattern", "M*-M",
                                   "--mamba-state-dim", "16", "--mamba-head-dim", "16", "--mamba-num-groups", "2",
                                   "--normalization", "RMSNorm", "--position-embedding-type", "none"};
  for (const std::vector<std::string>& more : {testing::gpt2_tokenizer_flags(), extra})
    argv.insert(argv.end(), more.begin(), more.end());
  return argv;
}

const std::vector<std::string>& kPrompts = testing::kMixedLengthPrompts;

class HybridGenerateCli : public testing::TrainedCheckpointCli<command> {
 protected:
  static test::RunResult run(const std::string& sub, std::vector<std::string> extra) {
    std::vector<std::string> a = {"--load", dir_->file("ckpt")};
    a.insert(a.end(), extra.begin(), extra.end());
    return test::run_with_timeout(command(sub, a), {"OMP_NUM_THREADS=1"}, 300);
  }
  // The texts: the output without the batching statistics lines (stderr, anywhere in the output).
  static std::string texts(const test::RunResult& r, std::string* stats) {
    static const std::regex line(R"(\[[^\]\n]*(tokens/s|Mamba decoding states)[^\]\n]*\]\n)");
    std::string all;
    for (std::sregex_iterator it(r.output.begin(), r.output.end(), line), end; it != end; ++it) all += it->str();
    if (stats) *stats = all;
    return std::regex_replace(r.output, line, "");
  }
};

TEST_F(HybridGenerateCli, GreedyAloneStaticAndDynamicBatchingGiveTheSameTexts) {
  ASSERT_EQ(trained_->exit_code, 0) << trained_->output;
  std::string alone;
  for (const std::string& p : kPrompts) {
    const test::RunResult r = run("generate", {"--prompt", p, "--temperature", "0", "--max-new-tokens", "12"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string text = texts(r, nullptr);
    EXPECT_EQ(text.rfind(p, 0), 0u) << "the prompt, then its continuation: " << r.output;
    EXPECT_GT(text.size(), p.size() + 1) << r.output;
    alone += text;
  }
  // --use-checkpoint-args: the hybrid model from the checkpoint's metadata (no model flags needed).
  std::vector<std::string> own_argv = {GALE_BINARY, "generate", "--load", dir_->file("ckpt"), "--use-checkpoint-args"};
  for (const std::vector<std::string>& more :
       {testing::gpt2_tokenizer_flags(),
        std::vector<std::string>{"--prompt", kPrompts[0], "--temperature", "0", "--max-new-tokens", "12"}})
    own_argv.insert(own_argv.end(), more.begin(), more.end());
  test::RunResult own = test::run_with_timeout(own_argv, {"OMP_NUM_THREADS=1"}, 300);
  ASSERT_EQ(own.exit_code, 0) << own.output;
  EXPECT_EQ(alone.rfind(texts(own, nullptr), 0), 0u) << own.output;
  std::string stats;
  test::RunResult st = run("generate", {"--prompts-file", prompts(), "--temperature", "0", "--max-new-tokens", "12",
                                        "--inference-max-requests", "2"});
  ASSERT_EQ(st.exit_code, 0) << st.output;
  EXPECT_EQ(texts(st, &stats), alone);
  // Mamba states of 2 requests: 2 Mamba layers x (conv 3 x 192 + ssm 8 x 16 x 16) floats.
  EXPECT_NE(stats.find("[hybrid model: Mamba decoding states " + std::to_string(2 * 2 * (3 * 192 + 8 * 16 * 16) * 4) +
                       " bytes]"),
            std::string::npos)
      << stats;
  // Peak KV: 2 requests x 64 positions x 1 attention layer x 2·64 floats x 4 bytes.
  EXPECT_NE(stats.find("peak KV bytes 65536]"), std::string::npos) << stats;
  test::RunResult dyn = run("generate", {"--prompts-file", prompts(), "--temperature", "0", "--max-new-tokens", "12",
                                         "--inference-dynamic-batching", "--inference-dynamic-batching-buffer-size-gb",
                                         "0.0023", "--inference-max-seq-length", "64",
                                         "--inference-dynamic-batching-block-size", "8",
                                         "--inference-dynamic-batching-max-tokens-override", "64"});
  ASSERT_EQ(dyn.exit_code, 0) << dyn.output;
  EXPECT_EQ(texts(dyn, &stats), alone);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(stats, m, std::regex(R"((\d+) joined mid-flight, (\d+) pauses, .* (\d+) blocks free at the end\])")))
      << stats;
  EXPECT_GT(std::stoi(m[1]), 0) << stats;
  EXPECT_GT(std::stoi(m[2]), 0) << stats;
}

TEST_F(HybridGenerateCli, SamplingBeamSearchChatAndPerplexityRun) {
  ASSERT_EQ(trained_->exit_code, 0) << trained_->output;
  // Sampling with a seed: the same draws alone and batched.
  const std::vector<std::string> sampling = {"--temperature", "0.9", "--top-k", "40", "--top-p", "0.9", "--seed", "5",
                                             "--max-new-tokens", "8"};
  std::string alone;
  for (const std::string& p : kPrompts) {
    std::vector<std::string> a = {"--prompt", p};
    a.insert(a.end(), sampling.begin(), sampling.end());
    const test::RunResult r = run("generate", a);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    alone += texts(r, nullptr);
  }
  std::vector<std::string> batched = {"--prompts-file", prompts(), "--inference-max-requests", "3"};
  batched.insert(batched.end(), sampling.begin(), sampling.end());
  const test::RunResult b = run("generate", batched);
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_EQ(texts(b, nullptr), alone);
  // Beam search (beams branch off and take over each other's Mamba states: tests/model/mamba_state_test.cc).
  const test::RunResult beam = run("generate", {"--prompt", kPrompts[3], "--num-beams", "3", "--max-new-tokens", "6"});
  ASSERT_EQ(beam.exit_code, 0) << beam.output;
  EXPECT_EQ(texts(beam, nullptr).rfind(kPrompts[3], 0), 0u) << beam.output;
  // Chat: one answer per line of standard input.
  TempDir chat;
  write_file(chat.file("in.txt"), "Hello there\nq\n");
  std::vector<std::string> argv =
      command("generate", {"--load", dir_->file("ckpt"), "--task", "chat", "--max-new-tokens", "6", "--seed", "3"});
  std::string line;
  for (const std::string& a : argv) line += "'" + a + "' ";
  const test::RunResult c = test::run_with_timeout({"/bin/sh", "-c", line + "<" + chat.file("in.txt")}, {}, 300);
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_NE(c.output.find("\nGale:\n"), std::string::npos) << c.output;
  // Perplexity of a corpus: the whole-sequence forward (no decoding state), a finite loss.
  TempDir data;
  write_file(data.file("docs.jsonl"), "{\"text\": \"It is a truth universally acknowledged.\"}\n");
  const test::RunResult e = run("evaluate", {"--task", "ppl", "--task-data-path", data.file("docs.jsonl")});
  ASSERT_EQ(e.exit_code, 0) << e.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(e.output, m, std::regex(R"(\| lm loss: ([0-9.E+-]+) \|)"))) << e.output;
  const double loss = std::stod(m[1]);
  EXPECT_TRUE(std::isfinite(loss) && loss > 0.0 && loss < std::log(50304.0) + 1.0) << e.output;
}

TEST_F(HybridGenerateCli, RefusesWhatIsNotSupportedYet) {
  ASSERT_EQ(trained_->exit_code, 0) << trained_->output;
  const test::RunResult h = run("generate", {"--prompt", "x", "--fp16"});
  EXPECT_EQ(h.exit_code, 2) << h.output;
  EXPECT_NE(h.output.find("--is-hybrid-model with --fp16: not supported yet"), std::string::npos) << h.output;
}

}  // namespace
}  // namespace gale
