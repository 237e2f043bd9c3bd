// `gale pretrain` with mixture-of-experts layers: Megatron's log line with load_balancing_loss, a
// falling loss on the mock data, the same losses at every optimisation level, bf16, and resuming.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include "cli/log_line.h"
#include "subprocess.h"

namespace gale {
namespace {

// A tiny Mixtral: LLaMA architecture, every MLP 4 SwiGLU experts with top-2 routing.
std::vector<std::string> mixtral(std::vector<std::string> extra) {
  std::vector<std::string> argv = {
      GALE_BINARY, "pretrain", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
      "--seq-length", "32", "--max-position-embeddings", "32", "--micro-batch-size", "2", "--global-batch-size", "4",
      "--train-iters", "6", "--lr", "3e-3", "--mock-data", "--vocab-size", "4096", "--log-interval", "1",
      "--eval-iters", "0", "--num-threads", "1", "--swiglu", "--normalization", "RMSNorm",
      "--position-embedding-type", "rope", "--disable-bias-linear", "--untie-embeddings-and-output-weights",
      "--attention-dropout", "0.0", "--hidden-dropout", "0.0", "--num-experts", "4", "--moe-router-topk", "2",
      "--moe-ffn-hidden-size", "64", "--moe-aux-loss-coeff", "1e-2", "--moe-grouped-gemm",
      "--moe-token-dispatcher-type", "alltoall"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

TEST(GalePretrainMoe, LogsTheLoadBalancingLossAfterTheLmLossAndLearns) {
  test::RunResult r = test::run_with_timeout(mixtral({"--moe-z-loss-coeff", "1e-3"}), {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::regex line(
      R"(\| global batch size:     4 \| lm loss: [0-9.]+E[+-]\d\d \| load_balancing_loss: [0-9.]+E[+-]\d\d \| z_loss: [0-9.]+E[+-]\d\d \| loss scale: 1\.0 \| grad norm: [0-9.]+ \|)");
  EXPECT_TRUE(std::regex_search(r.output, line)) << r.output;
  const std::vector<double> lm = testing::logged_values(r.output, "lm loss"), lb = testing::logged_values(r.output, "load_balancing_loss");
  ASSERT_EQ(lm.size(), 6u);
  ASSERT_EQ(lb.size(), 6u);
  EXPECT_LT(lm.back(), lm.front());
  // Without coefficient: E/(T²k)·Σ_e P_e·n_e is 1 for perfectly balanced routing and at most E/k... here near 1.
  for (double v : lb) {
    EXPECT_GT(v, 0.9);
    EXPECT_LT(v, 2.0);
  }
}

// DeepSeek-V3-style routing from the command line: sigmoid scores, expert bias, group-limited
// top-k, a scaling factor, the per-sequence loss (logged under Megatron's name) and token dropping.
TEST(GalePretrainMoe, DeepSeekRoutingLogsTheSeqLoadBalancingLossAndLearns) {
  test::RunResult r = test::run_with_timeout(
      mixtral({"--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias",
               "--moe-router-num-groups", "2", "--moe-router-group-topk", "1", "--moe-router-topk-scaling-factor",
               "2.5", "--moe-router-load-balancing-type", "seq_aux_loss", "--moe-expert-capacity-factor", "1.0",
               "--moe-pad-expert-input-to-capacity"}),
      {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<double> lm = testing::logged_values(r.output, "lm loss"), lb = testing::logged_values(r.output, "seq_load_balancing_loss");
  ASSERT_EQ(lm.size(), 6u);
  ASSERT_EQ(lb.size(), 6u);
  EXPECT_LT(lm.back(), lm.front());
  // Megatron's training_log tracks load_balancing_loss too (`"aux_loss" in "seq_aux_loss"`): never
  // recorded, it prints as zero, before seq_load_balancing_loss.
  EXPECT_NE(r.output.find("| lm loss: "), std::string::npos);
  const std::vector<double> plain = testing::logged_values(r.output, "load_balancing_loss");
  ASSERT_EQ(plain.size(), 6u) << r.output;
  for (double v : plain) EXPECT_EQ(v, 0.0);
  EXPECT_TRUE(std::regex_search(
      r.output, std::regex(R"(\| load_balancing_loss: 0\.000000E\+00 \| seq_load_balancing_loss: [0-9.]+E[+-]\d\d \|)")))
      << r.output;
  for (double v : lb) EXPECT_GT(v, 0.5);
}

// Megatron's list form: each load-balancing loss under its own tracker name, in Megatron's order; a
// list whose second coefficient is 0 trains as the scalar form bit for bit (its loss is off).
TEST(GalePretrainMoe, ListOfLoadBalancingTypesLogsEachUnderItsName) {
  test::RunResult both = test::run_with_timeout(
      mixtral({"--moe-router-load-balancing-type", "seq_aux_loss", "aux_loss", "--moe-aux-loss-coeff", "1e-3", "1e-2"}),
      {}, 300);
  ASSERT_EQ(both.exit_code, 0) << both.output;
  std::regex line(
      R"(\| lm loss: [0-9.]+E[+-]\d\d \| load_balancing_loss: [0-9.]+E[+-]\d\d \| seq_load_balancing_loss: [0-9.]+E[+-]\d\d \| loss scale)");
  EXPECT_TRUE(std::regex_search(both.output, line)) << both.output;
  const std::vector<double> lb = testing::logged_values(both.output, "load_balancing_loss"),
                            seq = testing::logged_values(both.output, "seq_load_balancing_loss");
  ASSERT_EQ(lb.size(), 6u);
  ASSERT_EQ(seq.size(), 6u);
  EXPECT_NE(lb, seq);

  test::RunResult scalar = test::run_with_timeout(mixtral({}), {}, 300);
  test::RunResult off = test::run_with_timeout(
      mixtral({"--moe-router-load-balancing-type", "aux_loss", "seq_aux_loss", "--moe-aux-loss-coeff", "1e-2", "0"}), {},
      300);
  ASSERT_EQ(scalar.exit_code, 0) << scalar.output;
  ASSERT_EQ(off.exit_code, 0) << off.output;
  for (const char* key : {"lm loss", "load_balancing_loss", "grad norm"})
    EXPECT_EQ(testing::logged_values(off.output, key), testing::logged_values(scalar.output, key)) << key;
  // A listed type whose coefficient is 0 is still tracked (Megatron's tracker reports its
  // zero-initialised entry; training_log prints averages >= 0).
  const std::vector<double> seq_off = testing::logged_values(off.output, "seq_load_balancing_loss");
  ASSERT_EQ(seq_off.size(), 6u) << off.output;
  for (double v : seq_off) EXPECT_EQ(v, 0.0);
  EXPECT_NE(testing::logged_values(both.output, "lm loss"), testing::logged_values(scalar.output, "lm loss"));
}

// --moe-router-force-load-balancing: random router logits (Gale's Philox streams), the same in
// every run; the experts then get about equal loads, so the load-balancing loss is near 1.
TEST(GalePretrainMoe, ForceLoadBalancingTrainsOnRandomLogitsDeterministically) {
  test::RunResult a = test::run_with_timeout(mixtral({"--moe-router-force-load-balancing"}), {}, 300);
  test::RunResult b = test::run_with_timeout(mixtral({"--moe-router-force-load-balancing"}), {}, 300);
  test::RunResult plain = test::run_with_timeout(mixtral({}), {}, 300);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  ASSERT_EQ(b.exit_code, 0) << b.output;
  const std::vector<double> lm = testing::logged_values(a.output, "lm loss"), lb = testing::logged_values(a.output, "load_balancing_loss");
  ASSERT_EQ(lm.size(), 6u);
  EXPECT_EQ(lm, testing::logged_values(b.output, "lm loss"));
  EXPECT_EQ(lb, testing::logged_values(b.output, "load_balancing_loss"));
  EXPECT_NE(lm, testing::logged_values(plain.output, "lm loss"));
  EXPECT_LT(lm.back(), lm.front());
  for (double v : lb) {
    EXPECT_GT(v, 0.9);
    EXPECT_LT(v, 1.2);
  }
}

TEST(GalePretrainMoe, NoLoadBalancingLossWithoutItsCoefficient) {
  test::RunResult r = test::run_with_timeout(mixtral({"--moe-router-load-balancing-type", "none"}), {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(testing::logged_values(r.output, "lm loss").size(), 6u);
  EXPECT_EQ(r.output.find("load_balancing_loss"), std::string::npos) << r.output;
}

TEST(GalePretrainMoe, SameLossesAtEveryOptimizationLevelAndWithBf16) {
  auto run = [&](std::vector<std::string> flags) {
    test::RunResult r = test::run_with_timeout(mixtral(flags), {}, 300);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return testing::logged_values(r.output, "lm loss");
  };
  const std::vector<double> l0 = run({"--optimization-level", "0"});
  const std::vector<double> l2 = run({"--use-flash-attn", "--use-fused-rmsnorm", "--use-fused-swiglu",
                                      "--use-fused-rotary-pos-emb", "--cross-entropy-loss-fusion"});
  const std::vector<double> bf16 = run({"--bf16"});
  ASSERT_EQ(l0.size(), 6u);
  ASSERT_EQ(l2.size(), 6u);
  ASSERT_EQ(bf16.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_NEAR(l2[i], l0[i], 1e-4 * l0[i]) << "iteration " << i + 1;
    EXPECT_NEAR(bf16[i], l0[i], 1e-2 * l0[i]) << "iteration " << i + 1;
  }
  EXPECT_LT(bf16.back(), bf16.front());
}

TEST(GalePretrainMoe, SaveThenResumeContinuesTheSameRun) {
  auto dir = std::filesystem::temp_directory_path() / ("gale_moe_ckpt_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  test::RunResult whole = test::run_with_timeout(mixtral({}), {}, 300);
  test::RunResult first =
      test::run_with_timeout(mixtral({"--save", dir.string(), "--save-interval", "3", "--exit-interval", "3"}), {}, 300);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  test::RunResult second = test::run_with_timeout(mixtral({"--load", dir.string()}), {}, 300);
  ASSERT_EQ(second.exit_code, 0) << second.output;
  const std::vector<double> a = testing::logged_values(whole.output, "lm loss"), b = testing::logged_values(second.output, "lm loss");
  const std::vector<double> la = testing::logged_values(whole.output, "load_balancing_loss"),
                            lb = testing::logged_values(second.output, "load_balancing_loss");
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 3u);
  ASSERT_EQ(lb.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(a[3 + i], b[i]) << "iteration " << 4 + i;
    EXPECT_EQ(la[3 + i], lb[i]) << "iteration " << 4 + i;
  }
  std::filesystem::remove_all(dir);
}

// A MoE checkpoint in `gale evaluate` (and `gale generate`, same loader): the model flags include
// the MoE flags; without them the checkpoint's expert tensors do not fit the dense model.
TEST(GalePretrainMoe, EvaluateReadsAMoeCheckpointGivenTheMoeFlags) {
  auto dir = std::filesystem::temp_directory_path() / ("gale_moe_eval_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string repo = std::string(GALE_TEST_DATA_DIR) + "/../..";
  const std::vector<std::string> model = {
      "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
      "--max-position-embeddings", "64", "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file",
      repo + "/data/tokenizers/gpt2/vocab.json", "--merge-file", repo + "/data/tokenizers/gpt2/merges.txt",
      "--swiglu", "--disable-bias-linear", "--num-experts", "4", "--moe-ffn-hidden-size", "32"};
  auto command = [&](const std::string& sub, const std::vector<std::string>& flags, std::vector<std::string> extra) {
    std::vector<std::string> argv = {GALE_BINARY, sub};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.insert(argv.end(), extra.begin(), extra.end());
    return argv;
  };
  test::RunResult trained = test::run_with_timeout(
      command("pretrain", model, {"--micro-batch-size", "2", "--train-iters", "2", "--lr", "3e-3", "--mock-data",
                                  "--eval-iters", "0", "--num-threads", "1", "--save", (dir / "ckpt").string(),
                                  "--save-interval", "2"}),
      {}, 300);
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  {
    std::ofstream docs(dir / "docs.jsonl");
    docs << "{\"text\": \"It is a truth universally acknowledged.\"}\n";
  }
  test::RunResult ppl = test::run_with_timeout(
      command("evaluate", model, {"--load", (dir / "ckpt").string(), "--task", "ppl", "--task-data-path",
                                  (dir / "docs.jsonl").string()}),
      {}, 300);
  ASSERT_EQ(ppl.exit_code, 0) << ppl.output;
  EXPECT_TRUE(std::regex_search(ppl.output, std::regex(R"(documents: 1 \| tokens: \d+ \| lm loss: [0-9.E+-]+)")))
      << ppl.output;
  std::vector<std::string> dense(model.begin(), model.end() - 4);  // without --num-experts / --moe-ffn-hidden-size
  test::RunResult wrong = test::run_with_timeout(
      command("evaluate", dense, {"--load", (dir / "ckpt").string(), "--task", "ppl", "--task-data-path",
                                  (dir / "docs.jsonl").string()}),
      {}, 300);
  EXPECT_NE(wrong.exit_code, 0);
  EXPECT_NE(wrong.output.find("mlp.linear_fc1.weight"), std::string::npos) << wrong.output;
  // --use-checkpoint-args: the checkpoint records the MoE flags too; the same loss without them here.
  const std::vector<std::string> tokenizer(model.begin() + 10, model.begin() + 16);
  test::RunResult own = test::run_with_timeout(
      command("evaluate", tokenizer, {"--load", (dir / "ckpt").string(), "--use-checkpoint-args", "--task", "ppl",
                                      "--task-data-path", (dir / "docs.jsonl").string()}),
      {}, 300);
  ASSERT_EQ(own.exit_code, 0) << own.output;
  std::smatch a, b;
  const std::regex loss(R"(lm loss: ([0-9.E+-]+))");
  ASSERT_TRUE(std::regex_search(ppl.output, a, loss));
  ASSERT_TRUE(std::regex_search(own.output, b, loss));
  EXPECT_EQ(a[1], b[1]);
  // Export to Hugging Face refuses, in one line, a MoE model that is not Mixtral-shaped (this one has
  // LayerNorm and learned positions).
  test::RunResult hf = test::run_with_timeout({GALE_BINARY, "convert", "--load-model-type", "gale", "--save-model-type",
                                               "hf", "--load-dir", (dir / "ckpt").string(), "--save-dir",
                                               (dir / "hf").string()},
                                              {}, 60);
  EXPECT_NE(hf.exit_code, 0);
  EXPECT_NE(hf.output.find("a mixture-of-experts model (4 experts) is written as MixtralForCausalLM only when it is "
                           "LLaMA-shaped"),
            std::string::npos)
      << hf.output;
  std::filesystem::remove_all(dir);
}

// Sinkhorn routing (no aux loss) learns, evaluates, and routes the same under full recomputation
// (whose first forward keeps no state but is still a training forward).
TEST(GalePretrainMoe, SinkhornRoutingTrainsAndRecomputesTheSameChoice) {
  auto run = [&](std::vector<std::string> flags) {
    flags.insert(flags.begin(), {"--moe-router-load-balancing-type", "sinkhorn", "--moe-aux-loss-coeff", "0",
                                 "--eval-interval", "3", "--eval-iters", "1"});
    test::RunResult r = test::run_with_timeout(mixtral(flags), {}, 300);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output.find("load_balancing_loss"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("validation loss at iteration 3"), std::string::npos) << r.output;
    return testing::logged_values(r.output, "lm loss");
  };
  const std::vector<double> plain = run({});
  const std::vector<double> recomputed =
      run({"--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"});
  ASSERT_EQ(plain.size(), 6u);
  ASSERT_EQ(recomputed.size(), 6u);
  EXPECT_LT(plain.back(), plain.front());
  for (size_t i = 0; i < 6; ++i) EXPECT_NEAR(recomputed[i], plain[i], 1e-5 * plain[i]) << "iteration " << i + 1;
}

TEST(GalePretrainMoe, UnsupportedCombinationsAreOneLineErrors) {
  test::RunResult r = test::run_with_timeout(mixtral({"--moe-router-load-balancing-type", "sinkhorn"}), {}, 60);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--moe-router-load-balancing-type sinkhorn: expected --moe-aux-loss-coeff 0"),
            std::string::npos)
      << r.output;
  test::RunResult bias = test::run_with_timeout(mixtral({"--moe-router-enable-expert-bias"}), {}, 60);
  EXPECT_EQ(bias.exit_code, 2);
  EXPECT_NE(bias.output.find("--moe-router-enable-expert-bias: expected --moe-router-score-function sigmoid"),
            std::string::npos)
      << bias.output;
}

}  // namespace
}  // namespace gale
