// `gale pretrain --load <Megatron MoE checkpoint>` at Gale's EP 1 and EP 2 (tests/data/megatron/moe/, Megatron core_v0.12.1).
//
// The fixtures' logits are checked against Megatron's in tests/train/megatron_moe_test.cc; here the
// user's path: the run continues at Megatron's iteration 7, and every layout of the same weights
// (EP 1 files, EP 2 GroupedMLP files, TP 2 x EP 2 files, torch_dist), loaded at Gale's EP 1, EP 2 or
// TP 2, logs the same first loss; --use-checkpoint-args takes the MoE shape from Megatron's args.
#include <gtest/gtest.h>

#include <random>

#include "ckpt/temp_dir.h"
#include "cli/log_line.h"
#include "cli/mpi_cli.h"
#include "data/data_test_util.h"
#include "subprocess.h"

namespace gale {
namespace {

using testing_util::TempDir;

std::string fixture(const std::string& name) { return std::string(GALE_TEST_DATA_DIR) + "/megatron/moe/" + name; }

// 50 documents of 20 random ids below 50.
void write_small_dataset(const std::string& prefix) {
  std::mt19937 rng(5);
  std::vector<std::vector<int32_t>> docs(50, std::vector<int32_t>(20));
  for (auto& d : docs)
    for (int32_t& t : d) t = static_cast<int32_t>(rng() % 50);
  testing::write_dataset(prefix, docs);
}

// The fixture's model (tools/reference/megatron_moe_reference.py) and one iteration after Megatron's 7.
std::vector<std::string> moe_model(const TempDir& tmp) {
  return {"--num-layers", "2", "--hidden-size", "16", "--ffn-hidden-size", "32", "--num-attention-heads", "2",
          "--swiglu", "--position-embedding-type", "rope", "--disable-bias-linear",
          "--untie-embeddings-and-output-weights", "--max-position-embeddings", "16", "--num-experts", "4",
          "--moe-router-topk", "2", "--moe-ffn-hidden-size", "8", "--moe-shared-expert-intermediate-size", "8"};
}

std::vector<std::string> training(const TempDir& tmp) {
  return {"--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias", "--seq-length", "8",
          "--micro-batch-size", "1", "--global-batch-size", "2", "--lr", "1e-4", "--attention-dropout", "0",
          "--hidden-dropout", "0", "--tokenizer-type", "NullTokenizer", "--vocab-size", "50",
          "--make-vocab-size-divisible-by", "32", "--data-path", tmp.file("data_text_document"), "--split", "100,0,0",
          "--eval-iters", "0", "--num-threads", "1", "--log-interval", "1", "--train-iters", "8", "--no-load-optim"};
}

test::RunResult pretrain(int np, std::vector<std::string> flags, const std::vector<std::string>& extra) {
  flags.insert(flags.begin(), {GALE_BINARY, "pretrain"});
  return test::run_with_timeout(testing::launch_argv(np, flags, extra),
                                np > 1 ? testing::kMpiEnv : std::vector<std::string>{"OMP_NUM_THREADS=1"}, 300);
}

TEST(MegatronMoeCli, PretrainContinuesEveryLayoutAtEp1AndEp2WithOneLoss) {
  TempDir tmp;
  write_small_dataset(tmp.file("data_text_document"));
  std::vector<std::string> flags = moe_model(tmp);
  const std::vector<std::string> t = training(tmp);
  flags.insert(flags.end(), t.begin(), t.end());
  test::RunResult r = pretrain(1, flags, {"--load", fixture("torch_ep1")});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("successfully loaded checkpoint from " + fixture("torch_ep1") + " at iteration 7"),
            std::string::npos)
      << r.output;
  const std::vector<double> ep1 = testing::logged_values(r.output, "lm loss");
  ASSERT_EQ(ep1.size(), 1u) << r.output;  // iteration 8 only
  struct Case {
    const char* fixture;
    std::vector<std::string> layout;
  };
  const Case cases[] = {{"torch_grouped_ep2", {"--expert-model-parallel-size", "2"}},
                        {"torch_dist", {"--expert-model-parallel-size", "2"}},
                        {"torch_tp2ep2", {"--tensor-model-parallel-size", "2", "--sequence-parallel"}}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.fixture);
    std::vector<std::string> extra = {"--load", fixture(c.fixture)};
    extra.insert(extra.end(), c.layout.begin(), c.layout.end());
    r = pretrain(2, flags, extra);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::vector<double> loss = testing::logged_values(r.output, "lm loss");
    ASSERT_EQ(loss.size(), 1u) << r.output;
    EXPECT_NEAR(loss[0], ep1[0], 1e-5 * ep1[0]);  // the same weights; only the reduction order differs
  }
  // --use-checkpoint-args: the MoE shape from Megatron's args (moe_layer_freq an int there).
  r = pretrain(1, t, {"--use-checkpoint-args", "--load", fixture("torch_dist")});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("Setting num_experts to 4 from checkpoint"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Setting moe_shared_expert_intermediate_size to 8 from checkpoint"), std::string::npos)
      << r.output;
  EXPECT_EQ(testing::logged_values(r.output, "lm loss"), ep1) << r.output;
}

}  // namespace
}  // namespace gale
