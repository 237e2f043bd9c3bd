// Offline DPO from a fine-tuned checkpoint, shared by the architecture DPO CLI tests: two SFT
// iterations make the starting point, DPO's reference model is a copy of it, so the first loss is
// log 2 (reference = policy) and the loss falls; each 2-rank layout reproduces the one-process
// losses and accuracies.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "cli/cli_test_util.h"
#include "cli/log_line.h"
#include "cli/mpi_cli.h"
#include "data/data_test_util.h"
#include "subprocess.h"

namespace gale::testing {

// tests/cli/dpo_cli_test.cc's tiny qwen-vocabulary model without dropout; `architecture` adds the
// model's own flags (and may override --num-layers, given after).
inline std::vector<std::string> dpo_test_model_flags(const std::vector<std::string>& architecture) {
  const std::string qwen = std::string(GALE_TEST_DATA_DIR) + "/tokenizers/qwen2_style";
  std::vector<std::string> flags = {
      "pretrain", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "128",
      "--max-position-embeddings", "128", "--lr", "1e-3", "--log-interval", "1", "--eval-interval", "1000",
      "--eval-iters", "0", "--num-threads", "1", "--attention-dropout", "0", "--hidden-dropout", "0", "--split",
      "100,0,0", "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", qwen,
      "--make-vocab-size-divisible-by", "64"};
  flags.insert(flags.end(), architecture.begin(), architecture.end());
  return flags;
}

inline void expect_dpo_from_sft_checkpoint(const std::vector<std::string>& architecture,
                                           const std::vector<std::vector<std::string>>& layouts) {
  const std::string ref = std::string(GALE_TEST_DATA_DIR) + "/reference";
  const std::string qwen = std::string(GALE_TEST_DATA_DIR) + "/tokenizers/qwen2_style";
  const std::vector<std::string> model = dpo_test_model_flags(architecture);
  TempDir dir;
  CommandResult p = run_gale("preprocess --handler-name AlpacaStylePairwiseHandler --input " + ref +
                                 "/dpo/pairwise.jsonl --output-prefix " + dir.file("pairs") +
                                 " --tokenizer-type HuggingFaceTokenizer --tokenizer-model " + qwen +
                                 " --prompt-type qwen --seq-length 64",
                             dir.path());
  ASSERT_EQ(p.exit_code, 0) << p.err;
  std::vector<std::string> sft = {GALE_BINARY};  // two SFT iterations: the fine-tuned starting point
  sft.insert(sft.end(), model.begin(), model.end());
  sft.insert(sft.end(), {"--is-instruction-dataset", "--data-path", ref + "/sft/qwen", "--micro-batch-size", "2",
                         "--global-batch-size", "4", "--train-iters", "2", "--save", dir.file("sft"),
                         "--save-interval", "2", "--lr", "3e-3"});
  test::RunResult s = test::run_with_timeout(sft, {}, 300);
  ASSERT_EQ(s.exit_code, 0) << s.output;
  auto dpo = [&](int np, const std::vector<std::string>& extra) {
    std::vector<std::string> flags = model;
    flags.insert(flags.end(), {"--stage", "dpo", "--is-pairwise-dataset", "--data-path", dir.file("pairs"), "--load",
                               dir.file("sft"), "--finetune", "--micro-batch-size", "1", "--global-batch-size", "2",
                               "--train-iters", "8", "--dpo-beta", "0.5"});
    flags.insert(flags.end(), extra.begin(), extra.end());
    return test::run_with_timeout(launch_argv(np, {GALE_BINARY}, flags), np > 1 ? kMpiEnv : std::vector<std::string>{}, 300);
  };
  test::RunResult one = dpo(1, {});
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_NE(one.output.find("loaded the reference model from"), std::string::npos) << one.output;
  const std::vector<double> loss = logged_values(one.output, "lm loss");
  ASSERT_EQ(loss.size(), 8u) << one.output;
  EXPECT_NEAR(loss.front(), std::log(2.0), 1e-6) << one.output;  // the reference is the policy
  EXPECT_LT(loss.back(), 0.8 * loss.front()) << one.output;
  for (const std::vector<std::string>& layout : layouts) {
    SCOPED_TRACE(layout.empty() ? "dp2" : layout[0]);
    test::RunResult two = dpo(2, layout);
    ASSERT_EQ(two.exit_code, 0) << two.output;
    const std::vector<double> loss2 = logged_values(two.output, "lm loss");
    ASSERT_EQ(loss2.size(), loss.size()) << two.output;
    for (size_t i = 0; i < loss.size(); ++i) EXPECT_NEAR(loss2[i], loss[i], 1e-5 * loss[i]) << "iteration " << i + 1;
    EXPECT_EQ(logged_values(two.output, "rewards/accuracies"), logged_values(one.output, "rewards/accuracies"));
  }
}

}  // namespace gale::testing
