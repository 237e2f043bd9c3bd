// `gale pretrain --is-hybrid-model --hybrid-layer-pattern 'M+-M'` (Megatron main's hybrid mla_layer;
// '+' sets --multi-latent-attention): the loss falls, save and resume continue the same run exactly,
// and `gale generate` loads the checkpoint (its args record MLA) and decodes with the MLA layers' KV
// cache beside the Mamba states: a prompt alone and in a static batch give the same tokens.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include "log_line.h"
#include "mpi_cli.h"
#include "subprocess.h"

namespace gale {
namespace {

std::vector<std::string> hybrid_mla(int iters, std::vector<std::string> extra) {
  std::vector<std::string> flags = {
      "--is-hybrid-model", "--hybrid-layer-pattern", "M+-M", "--mamba-state-dim", "16", "--mamba-head-dim", "16",
      "--mamba-num-groups", "2", "--kv-lora-rank", "16", "--qk-head-dim", "8", "--qk-pos-emb-head-dim", "8",
      "--v-head-dim", "8", "--normalization", "RMSNorm", "--position-embedding-type", "rope", "--hidden-dropout", "0.0",
      "--lr", "1e-2", "--lr-decay-style", "constant", "--log-interval", "1"};
  return testing::tiny_gpt_pretrain(1, iters, flags, extra);
}

test::RunResult run(const std::vector<std::string>& argv) { return test::run_with_timeout(argv, {}, 600); }

TEST(GalePretrainHybridMla, LearnsResumesExactlyAndGenerates) {
  auto dir = std::filesystem::temp_directory_path() / ("gale_hybrid_mla_ckpt_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  test::RunResult whole = run(hybrid_mla(12, {}));
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  const std::vector<double> l = testing::logged_values(whole.output, "lm loss");
  ASSERT_EQ(l.size(), 12u);
  EXPECT_LT((l[9] + l[10] + l[11]) / 3, (l[0] + l[1] + l[2]) / 3 - 0.1) << whole.output;
  test::RunResult first = run(hybrid_mla(12, {"--save", dir.string(), "--save-interval", "6", "--exit-interval", "6"}));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  test::RunResult second = run(hybrid_mla(12, {"--load", dir.string()}));
  ASSERT_EQ(second.exit_code, 0) << second.output;
  const std::vector<double> b = testing::logged_values(second.output, "lm loss");
  ASSERT_EQ(b.size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(b[i], l[6 + i]) << "iteration " << 7 + i;
  const std::vector<std::string> gen_args = {GALE_BINARY, "generate", "--load", dir.string(), "--use-checkpoint-args",
                                             "--tokenizer-type", "NullTokenizer", "--vocab-size", "4096",
                                             "--max-new-tokens", "3"};
  std::vector<std::string> alone_args = gen_args;
  alone_args.insert(alone_args.end(), {"--prompt", "5 17"});
  test::RunResult gen = run(alone_args);
  ASSERT_EQ(gen.exit_code, 0) << gen.output;
  std::smatch alone;
  ASSERT_TRUE(std::regex_search(gen.output, alone, std::regex("5 17 \\d+ \\d+ \\d+\n"))) << gen.output;
  std::ofstream(dir / "prompts.txt") << "5 17\n3 4 5 6\n";
  std::vector<std::string> batch = gen_args;
  batch.insert(batch.end(), {"--prompts-file", (dir / "prompts.txt").string()});
  test::RunResult st = run(batch);
  ASSERT_EQ(st.exit_code, 0) << st.output;
  EXPECT_TRUE(std::regex_search(st.output, std::regex("(^|\n)" + alone.str() + "3 4 5 6 \\d+ \\d+ \\d+\n")))
      << "the first prompt's tokens alone, then the second's\n" << st.output;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace gale
