// Offline DPO (--stage dpo) of a hybrid Mamba model (--is-hybrid-model, "M*-M"): the reference model
// is a second copy of the policy's config, its Mamba layers included (src/train/pretrain.cc), so a
// fine-tuned hybrid checkpoint starts at loss log 2 (reference = policy) and the loss falls; tensor,
// data, pipeline and context parallelism 2 (the Mamba layers' all-to-alls) reproduce the
// one-process losses and accuracies.
#include <gtest/gtest.h>

#include <cmath>

#include "cli/cli_test_util.h"
#include "cli/log_line.h"
#include "cli/mpi_cli.h"
#include "data/data_test_util.h"
#include "subprocess.h"

namespace gale {
namespace {

using testing::run_gale;
using testing::TempDir;

const std::string kRef = std::string(GALE_TEST_DATA_DIR) + "/reference/dpo";
const std::string kSft = std::string(GALE_TEST_DATA_DIR) + "/reference/sft";
const std::string kQwen = std::string(GALE_TEST_DATA_DIR) + "/tokenizers/qwen2_style";

// tests/cli/dpo_cli_test.cc's tiny qwen-vocabulary model without dropout, as "M*-M" (d_inner 128: 8
// heads of 16 in 2 groups, d_state 16).
std::vector<std::string> model_flags() {
  return {"pretrain", "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "128",
          "--max-position-embeddings", "128", "--lr", "1e-3", "--log-interval", "1", "--eval-interval", "1000",
          "--eval-iters", "0", "--num-threads", "1", "--attention-dropout", "0", "--hidden-dropout", "0",
          "--split", "100,0,0", "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", kQwen,
          "--make-vocab-size-divisible-by", "64", "--is-hybrid-model", "--hybrid-override-pattern", "M*-M",
          "--mamba-head-dim", "16", "--mamba-num-groups", "2", "--mamba-state-dim", "16"};
}

std::vector<std::string> dpo(int np, const std::string& data, const std::string& load,
                             const std::vector<std::string>& extra) {
  std::vector<std::string> flags = model_flags();
  for (const char* f : {"--stage", "dpo", "--is-pairwise-dataset", "--data-path"}) flags.push_back(f);
  flags.insert(flags.end(), {data, "--load", load, "--finetune", "--micro-batch-size", "1", "--global-batch-size", "2",
                             "--train-iters", "8", "--dpo-beta", "0.5"});
  flags.insert(flags.end(), extra.begin(), extra.end());
  return testing::launch_argv(np, {GALE_BINARY}, flags);
}

TEST(HybridDpo, StartsAtLogTwoLowersTheLossAndParallelRunsMatch) {
  TempDir dir;
  auto p = run_gale("preprocess --handler-name AlpacaStylePairwiseHandler --input " + kRef +
                        "/pairwise.jsonl --output-prefix " + dir.file("pairs") +
                        " --tokenizer-type HuggingFaceTokenizer --tokenizer-model " + kQwen +
                        " --prompt-type qwen --seq-length 64",
                    dir.path());
  ASSERT_EQ(p.exit_code, 0) << p.err;
  std::vector<std::string> sft = {GALE_BINARY};  // two SFT iterations: the fine-tuned starting point
  for (const std::string& f : model_flags()) sft.push_back(f);
  sft.insert(sft.end(), {"--is-instruction-dataset", "--data-path", kSft + "/qwen", "--micro-batch-size", "2",
                         "--global-batch-size", "4", "--train-iters", "2", "--save", dir.file("sft"),
                         "--save-interval", "2", "--lr", "3e-3"});
  test::RunResult s = test::run_with_timeout(sft, {}, 300);
  ASSERT_EQ(s.exit_code, 0) << s.output;

  test::RunResult one = test::run_with_timeout(dpo(1, dir.file("pairs"), dir.file("sft"), {}), {}, 300);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_NE(one.output.find("loaded the reference model from"), std::string::npos) << one.output;
  const std::vector<double> loss = testing::logged_values(one.output, "lm loss");
  ASSERT_EQ(loss.size(), 8u) << one.output;
  EXPECT_NEAR(loss.front(), std::log(2.0), 1e-6) << one.output;  // the reference is the policy
  EXPECT_LT(loss.back(), 0.8 * loss.front()) << one.output;
  for (const std::vector<std::string>& layout :
       {std::vector<std::string>{"--tensor-model-parallel-size", "2"}, std::vector<std::string>{},
        std::vector<std::string>{"--pipeline-model-parallel-size", "2"},
        std::vector<std::string>{"--context-parallel-size", "2"}}) {
    SCOPED_TRACE(layout.empty() ? "dp2" : layout[0]);
    test::RunResult two =
        test::run_with_timeout(dpo(2, dir.file("pairs"), dir.file("sft"), layout), testing::kMpiEnv, 300);
    ASSERT_EQ(two.exit_code, 0) << two.output;
    const std::vector<double> loss2 = testing::logged_values(two.output, "lm loss");
    ASSERT_EQ(loss2.size(), loss.size()) << two.output;
    for (size_t i = 0; i < loss.size(); ++i) EXPECT_NEAR(loss2[i], loss[i], 1e-5 * loss[i]) << "iteration " << i + 1;
    EXPECT_EQ(testing::logged_values(two.output, "rewards/accuracies"), testing::logged_values(one.output, "rewards/accuracies"));
  }
}

}  // namespace
}  // namespace gale
