// `gale pretrain --is-hybrid-model` with MoE layers ('E' in --hybrid-override-pattern, Nemotron-H
// MoE style): the loss falls with the load-balancing loss logged as Megatron does for hybrid models
// (the mean over the 'E' layers), expert parallelism 2, tensor parallelism 2 (+SP) and context
// parallelism 2 reproduce the one-process losses, save and resume continue the same run bit for bit,
// `gale generate` runs the checkpoint, and what is not supported yet is refused in one line.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <regex>

#include "log_line.h"
#include "mpi_cli.h"
#include "subprocess.h"

namespace gale {
namespace {

// Four layers M E * E (hidden 64: d_inner 128, 8 heads of 16, 2 groups, d_state 16), 4 experts of
// FFN 32 with top-2 routing and a shared expert of 32 (no linear biases), the load-balancing loss
// at 1e-2; no position embedding, micro-batches of 1 (2 per rank at DP 2), one thread per rank.
std::vector<std::string> hybrid_moe(int np, int iters, std::vector<std::string> extra) {
  std::vector<std::string> flags = {
      "--is-hybrid-model", "--num-layers", "4", "--hybrid-override-pattern", "ME*E", "--mamba-state-dim", "16",
      "--mamba-head-dim", "16", "--mamba-num-groups", "2", "--normalization", "RMSNorm", "--position-embedding-type",
      "none", "--hidden-dropout", "0.0", "--lr", "1e-2", "--lr-decay-style", "constant", "--log-interval", "1",
      "--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "32",
      "--moe-shared-expert-intermediate-size", "32", "--disable-bias-linear", "--moe-aux-loss-coeff", "1e-2",
      "--moe-token-dispatcher-type", "alltoall"};
  return testing::tiny_gpt_pretrain(np, iters, flags, extra);
}

test::RunResult run(const std::vector<std::string>& argv, int np = 1) {
  return test::run_with_timeout(argv, np > 1 ? testing::kMpiEnv : std::vector<std::string>{}, 600);
}

// The loss falls over 16 steps; the load-balancing loss is the mean over the two 'E' layers (logged
// without the coefficient, as Megatron's tracker: at the near-uniform initial routing each layer's
// is about 1, so a sum would be about 2). EP 2
// (each rank 2 of the 4 experts, 2 of the 4 samples, tokens exchanged all-to-all) and TP 2 with SP
// (each rank routes its half of the sequence) and CP 2 (each rank routes its two chunks of the
// sequence; the Mamba layer scans whole sequences of half its heads) give the one-process losses:
// the sums run in another order, ~1e-7 relative per step.
TEST(GalePretrainHybridMoe, LearnsAndExpertTensorAndContextParallelMatchOneProcess) {
  test::RunResult one = run(hybrid_moe(1, 16, {}));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_NE(one.output.find("Hybrid allocation (M is mamba, * is attention, - is mlp, E is moe): ME*E (1 attention, "
                            "0 mlp, 2 moe, 1 mamba layers)"),
            std::string::npos)
      << one.output;
  const std::vector<double> l = testing::logged_values(one.output, "lm loss");
  const std::vector<double> lb = testing::logged_values(one.output, "load_balancing_loss");
  ASSERT_EQ(l.size(), 16u) << one.output;
  ASSERT_EQ(lb.size(), 16u) << one.output;
  EXPECT_NEAR(lb[0], 1.0, 0.2) << one.output;
  const double first = (l[0] + l[1] + l[2] + l[3]) / 4, last = (l[12] + l[13] + l[14] + l[15]) / 4;
  EXPECT_LT(last, first - 0.15) << one.output;
  for (const std::vector<std::string>& layout :
       {std::vector<std::string>{"--expert-model-parallel-size", "2"},
        std::vector<std::string>{"--tensor-model-parallel-size", "2", "--sequence-parallel",
                                 "--make-vocab-size-divisible-by", "64"},
        std::vector<std::string>{"--context-parallel-size", "2"}}) {
    test::RunResult two = run(hybrid_moe(2, 16, layout), 2);
    ASSERT_EQ(two.exit_code, 0) << two.output;
    const std::vector<double> l2 = testing::logged_values(two.output, "lm loss");
    const std::vector<double> lb2 = testing::logged_values(two.output, "load_balancing_loss");
    ASSERT_EQ(l2.size(), 16u) << two.output;
    ASSERT_EQ(lb2.size(), 16u) << two.output;
    for (size_t i = 0; i < l.size(); ++i) {
      EXPECT_NEAR(l2[i], l[i], 1e-4 * l[i]) << layout[0] << ", iteration " << i + 1;
      EXPECT_NEAR(lb2[i], lb[i], 1e-4 * lb[i]) << layout[0] << ", iteration " << i + 1;
    }
  }
}

TEST(GalePretrainHybridMoe, SaveThenResumeContinuesTheSameRunAndGenerates) {
  auto dir = std::filesystem::temp_directory_path() / ("gale_hybrid_moe_ckpt_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  test::RunResult whole = run(hybrid_moe(1, 6, {}));
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  test::RunResult first =
      run(hybrid_moe(1, 6, {"--save", dir.string(), "--save-interval", "3", "--exit-interval", "3"}));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  test::RunResult second = run(hybrid_moe(1, 6, {"--load", dir.string()}));
  ASSERT_EQ(second.exit_code, 0) << second.output;
  const std::vector<double> a = testing::logged_values(whole.output, "lm loss"),
                            b = testing::logged_values(second.output, "lm loss");
  const std::vector<double> la = testing::logged_values(whole.output, "load_balancing_loss"),
                            lb = testing::logged_values(second.output, "load_balancing_loss");
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 3u);
  ASSERT_EQ(lb.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(a[3 + i], b[i]) << "iteration " << 4 + i;
    EXPECT_EQ(la[3 + i], lb[i]) << "iteration " << 4 + i;
  }
  // The checkpoint's args give the hybrid MoE model (the 'E' layers from its pattern): generation
  // builds it and runs its MoE layers (their decoding against full forwards: tests/model/mamba_state_test.cc).
  test::RunResult gen = run({GALE_BINARY, "generate", "--load", dir.string(), "--use-checkpoint-args",
                             "--tokenizer-type", "NullTokenizer", "--vocab-size", "4096", "--prompt", "5 17",
                             "--max-new-tokens", "2"});
  EXPECT_EQ(gen.exit_code, 0) << gen.output;
  EXPECT_TRUE(std::regex_search(gen.output, std::regex("\n5 17 \\d+ \\d+\n"))) << gen.output;
  std::filesystem::remove_all(dir);
}

TEST(GalePretrainHybridMoe, RefusesWhatIsNotSupportedYet) {
  struct Case {
    std::vector<std::string> flags;
    const char* message;
  };
  const Case cases[] = {
      {{"--hybrid-override-pattern", "ME*E", "--num-layers", "4"},
       "--hybrid-override-pattern: the MoE layers ('E') of 'ME*E' need --num-experts, found no --num-experts"},
      {{"--hybrid-override-pattern", "M*", "--num-experts", "4"},
       "--num-experts with --is-hybrid-model: expected MoE layers ('E') in --hybrid-override-pattern, found none in "
       "'M*'"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> flags = {"--is-hybrid-model", "--mamba-state-dim", "16", "--mamba-head-dim", "16",
                                      "--mamba-num-groups", "2"};
    flags.insert(flags.end(), c.flags.begin(), c.flags.end());
    test::RunResult r = run(testing::tiny_gpt_pretrain(1, 2, flags, {}));
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.message << "\n" << r.output;
  }
  test::RunResult freq = run(hybrid_moe(1, 2, {"--moe-layer-freq", "[0,1,0,1]"}));
  EXPECT_NE(freq.exit_code, 0) << freq.output;
  EXPECT_NE(freq.output.find("--moe-layer-freq with --is-hybrid-model: expected no --moe-layer-freq"),
            std::string::npos)
      << freq.output;
}

}  // namespace
}  // namespace gale
