// `gale pretrain --experimental-attention-variant dsa`: the lm loss falls on the mock data, the log
// line carries Megatron's "indexer loss" after the lm loss, the fused sparse attention gives the
// reference's losses, under --bf16 too, and with pipeline parallelism (2 stages) the same losses and
// indexer losses as one process.
#include <gtest/gtest.h>

#include <regex>

#include "mpi_cli.h"
#include "subprocess.h"

namespace gale {
namespace {

std::vector<std::string> dsa_model(std::vector<std::string> extra) {
  std::vector<std::string> argv = {
      "pretrain", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
      "--seq-length", "64", "--max-position-embeddings", "64", "--micro-batch-size", "2", "--global-batch-size", "4",
      "--train-iters", "8", "--lr", "3e-3", "--mock-data", "--vocab-size", "4096", "--log-interval", "1",
      "--eval-iters", "0", "--num-threads", "1", "--swiglu", "--normalization", "RMSNorm",
      "--position-embedding-type", "rope", "--disable-bias-linear", "--attention-dropout", "0.0", "--hidden-dropout",
      "0.0", "--multi-latent-attention", "--q-lora-rank", "24", "--kv-lora-rank", "16", "--qk-head-dim", "16",
      "--qk-pos-emb-head-dim", "8", "--v-head-dim", "16", "--qk-layernorm", "--experimental-attention-variant", "dsa",
      "--dsa-indexer-n-heads", "2", "--dsa-indexer-head-dim", "16", "--dsa-indexer-topk", "12",
      "--dsa-indexer-loss-coeff", "0.5"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

std::vector<double> numbers(const std::string& output, const char* field) {
  std::vector<double> out;
  std::regex re(std::string("\\| ") + field + ": ([0-9.E+-]+) \\|");
  for (std::sregex_iterator it(output.begin(), output.end(), re), end; it != end; ++it) out.push_back(std::stod((*it)[1]));
  return out;
}

test::RunResult run(int np, std::vector<std::string> extra) {
  std::vector<std::string> argv = dsa_model(std::move(extra));
  argv.insert(argv.begin(), GALE_BINARY);
  argv = testing::launch_argv(np, argv, {});
  return test::run_with_timeout(argv, testing::kMpiEnv, 300);
}

TEST(GalePretrainDsa, LearnsAndLogsTheIndexerLossWithReferenceAndFusedKernels) {
  const test::RunResult ref = run(1, {"--optimization-level", "0"});
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  const std::vector<double> lm = numbers(ref.output, "lm loss"), idx = numbers(ref.output, "indexer loss");
  ASSERT_EQ(lm.size(), 8u) << ref.output;
  ASSERT_EQ(idx.size(), 8u) << ref.output;
  EXPECT_LT(lm.back(), lm.front() - 0.1);
  for (double v : idx) EXPECT_GT(v, 0.0);
  EXPECT_NE(ref.output.find("| lm loss: "), std::string::npos);
  EXPECT_LT(ref.output.find("| lm loss: "), ref.output.find("| indexer loss: "));  // Megatron's order

  const test::RunResult fused = run(1, {"--use-fused-sparse-flash-attention"});
  ASSERT_EQ(fused.exit_code, 0) << fused.output;
  const std::vector<double> lm2 = numbers(fused.output, "lm loss"), idx2 = numbers(fused.output, "indexer loss");
  ASSERT_EQ(lm2.size(), 8u);
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_NEAR(lm2[i], lm[i], 1e-4 * lm[i]) << "iteration " << i + 1;
    EXPECT_NEAR(idx2[i], idx[i], 1e-2 * idx[i] + 1e-7) << "iteration " << i + 1;
  }

  const test::RunResult bf16 = run(1, {"--bf16"});
  ASSERT_EQ(bf16.exit_code, 0) << bf16.output;
  const std::vector<double> lm3 = numbers(bf16.output, "lm loss");
  ASSERT_EQ(lm3.size(), 8u);
  for (size_t i = 0; i < 8; ++i) EXPECT_NEAR(lm3[i], lm[i], 1e-2 * lm[i]) << "iteration " << i + 1;
}

TEST(GalePretrainDsa, TwoPipelineStagesGiveTheSameLosses) {
  const test::RunResult one = run(1, {});
  const test::RunResult two = run(2, {"--pipeline-model-parallel-size", "2"});
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ASSERT_EQ(two.exit_code, 0) << two.output;
  for (const char* field : {"lm loss", "indexer loss"}) {
    const std::vector<double> a = numbers(one.output, field), b = numbers(two.output, field);
    ASSERT_EQ(a.size(), 8u) << field;
    ASSERT_EQ(b.size(), 8u) << field << two.output;
    for (size_t i = 0; i < 8; ++i) EXPECT_NEAR(b[i], a[i], 1e-5 * a[i] + 1e-9) << field << ", iteration " << i + 1;
  }
}

TEST(GalePretrainDsa, RefusedLayoutsAreOneLineErrorsNamingTheFlags) {
  const test::RunResult tp = run(1, {"--tensor-model-parallel-size", "2"});
  EXPECT_NE(tp.exit_code, 0);
  EXPECT_NE(tp.output.find("--tensor-model-parallel-size"), std::string::npos) << tp.output;
  const test::RunResult absorb = run(1, {"--use-dsa-absorb"});
  EXPECT_NE(absorb.exit_code, 0);
  EXPECT_NE(absorb.output.find("--use-dsa-absorb: not supported yet"), std::string::npos) << absorb.output;
}

}  // namespace
}  // namespace gale
