// `gale pretrain --mtp-num-layers`: the mock-data run logs Megatron's "mtp_1 loss" (and
// "mtp_2 loss") after lm loss, both falling; save and resume continue the same run exactly (the MTP
// parameters and their optimizer state are in the checkpoint); with factor 0 the LM losses are
// those of the model without MTP. `gale generate` and `gale evaluate` load the MTP checkpoint (without
// its MTP layers). Under pipeline parallelism (mpirun -np 2, the MTP layers and the embedding's copy
// on the last stage) the losses are logged once per iteration, a checkpoint saved at PP 2 resumes
// exactly at PP 2 and, in one process, to the losses of the PP 2 run, and `gale generate` loads it.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>

#include "cli/mpi_cli.h"
#include "log_line.h"
#include "subprocess.h"

namespace gale {
namespace {

std::vector<std::string> pretrain(std::vector<std::string> extra) {
  std::vector<std::string> argv = {
      GALE_BINARY, "pretrain", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
      "--seq-length", "32", "--max-position-embeddings", "64", "--micro-batch-size", "2", "--global-batch-size", "4",
      "--train-iters", "6", "--lr", "3e-3", "--mock-data", "--vocab-size", "4096", "--log-interval", "1",
      "--eval-iters", "0", "--num-threads", "1", "--swiglu", "--normalization", "RMSNorm",
      "--position-embedding-type", "rope", "--disable-bias-linear", "--untie-embeddings-and-output-weights",
      "--attention-dropout", "0.0", "--hidden-dropout", "0.1"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

TEST(GalePretrainMtp, LogsTheMtpLossesAndResumesExactly) {
  auto dir = std::filesystem::temp_directory_path() / ("gale_mtp_ckpt_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const std::vector<std::string> mtp = {"--mtp-num-layers", "2", "--mtp-loss-scaling-factor", "0.2"};
  test::RunResult whole = test::run_with_timeout(pretrain(mtp), {}, 300);
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  const std::vector<double> lm = testing::logged_values(whole.output, "lm loss");
  const std::vector<double> m1 = testing::logged_values(whole.output, "mtp_1 loss");
  const std::vector<double> m2 = testing::logged_values(whole.output, "mtp_2 loss");
  ASSERT_EQ(lm.size(), 6u);
  ASSERT_EQ(m1.size(), 6u);
  ASSERT_EQ(m2.size(), 6u);
  EXPECT_LT(m1.back(), m1.front() - 0.05);
  EXPECT_NE(whole.output.find(" | mtp_1 loss: "), std::string::npos);
  EXPECT_LT(whole.output.find(" | lm loss: "), whole.output.find(" | mtp_1 loss: "));
  EXPECT_LT(whole.output.find(" | mtp_1 loss: "), whole.output.find(" | mtp_2 loss: "));

  std::vector<std::string> save = mtp;
  save.insert(save.end(), {"--save", dir.string(), "--save-interval", "3", "--exit-interval", "3"});
  test::RunResult first = test::run_with_timeout(pretrain(save), {}, 300);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  std::vector<std::string> load = mtp;
  load.insert(load.end(), {"--load", dir.string()});
  test::RunResult second = test::run_with_timeout(pretrain(load), {}, 300);
  ASSERT_EQ(second.exit_code, 0) << second.output;
  const std::vector<double> lm_b = testing::logged_values(second.output, "lm loss");
  const std::vector<double> m1_b = testing::logged_values(second.output, "mtp_1 loss");
  const std::vector<double> m2_b = testing::logged_values(second.output, "mtp_2 loss");
  ASSERT_EQ(lm_b.size(), 3u);
  ASSERT_EQ(m1_b.size(), 3u);
  ASSERT_EQ(m2_b.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(lm[3 + i], lm_b[i]) << "iteration " << 4 + i;
    EXPECT_EQ(m1[3 + i], m1_b[i]) << "iteration " << 4 + i;
    EXPECT_EQ(m2[3 + i], m2_b[i]) << "iteration " << 4 + i;
  }

  // generate and evaluate load the MTP checkpoint (iteration 6 now) as Megatron's inference does:
  // the model without its MTP layers, their tensors ignored; from the checkpoint's args or from the
  // command line's model flags (--mtp-num-layers among them), the same greedy tokens.
  const std::vector<std::string> tokenizer = {"--tokenizer-type", "NullTokenizer", "--vocab-size", "4096"};
  auto generate = [&](std::vector<std::string> model) {
    std::vector<std::string> argv = {GALE_BINARY, "generate", "--load", dir.string(), "--prompt", "5 17 300 2 41",
                                     "--max-new-tokens", "6", "--temperature", "0"};
    argv.insert(argv.end(), tokenizer.begin(), tokenizer.end());
    argv.insert(argv.end(), model.begin(), model.end());
    return test::run_with_timeout(argv, {}, 300);
  };
  test::RunResult from_args = generate({"--use-checkpoint-args"});
  ASSERT_EQ(from_args.exit_code, 0) << from_args.output;
  std::smatch tokens;
  ASSERT_TRUE(std::regex_search(from_args.output, tokens, std::regex(R"(5 17 300 2 41( \d+){6}\n)")))
      << from_args.output;
  std::vector<std::string> flags = {"--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
                                    "--seq-length", "32", "--max-position-embeddings", "64", "--swiglu",
                                    "--normalization", "RMSNorm", "--position-embedding-type", "rope",
                                    "--disable-bias-linear", "--untie-embeddings-and-output-weights"};
  flags.insert(flags.end(), mtp.begin(), mtp.end());
  test::RunResult from_flags = generate(flags);
  ASSERT_EQ(from_flags.exit_code, 0) << from_flags.output;
  EXPECT_NE(from_flags.output.find(tokens.str()), std::string::npos) << from_flags.output;
  {
    std::ofstream docs(dir / "docs.jsonl");
    docs << "{\"text\": \"5 17 300 2 41 7 7 9\"}\n{\"text\": \"1 2 3 4 5 6\"}\n";
  }
  std::vector<std::string> eval = {GALE_BINARY, "evaluate", "--load", dir.string(), "--use-checkpoint-args",
                                   "--task", "ppl", "--task-data-path", (dir / "docs.jsonl").string()};
  eval.insert(eval.end(), tokenizer.begin(), tokenizer.end());
  test::RunResult ppl = test::run_with_timeout(eval, {}, 300);
  ASSERT_EQ(ppl.exit_code, 0) << ppl.output;
  EXPECT_TRUE(std::regex_search(ppl.output, std::regex(R"(\| lm loss: [0-9.E+-]+ \|)"))) << ppl.output;
  std::filesystem::remove_all(dir);
}

TEST(GalePretrainMtp, ZeroFactorKeepsTheLmLossesOfTheModelWithoutMtp) {
  test::RunResult plain = test::run_with_timeout(pretrain({}), {}, 300);
  test::RunResult zero = test::run_with_timeout(pretrain({"--mtp-num-layers", "1", "--mtp-loss-scaling-factor", "0"}), {}, 300);
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  ASSERT_EQ(zero.exit_code, 0) << zero.output;
  EXPECT_EQ(testing::logged_values(plain.output, "lm loss"), testing::logged_values(zero.output, "lm loss"));
  EXPECT_TRUE(testing::logged_values(plain.output, "mtp_1 loss").empty());
  EXPECT_EQ(testing::logged_values(zero.output, "mtp_1 loss").size(), 6u);
}

TEST(GalePretrainMtp, PipelineParallelSaveResumesAtPp2AndInOneProcess) {
  auto dir = std::filesystem::temp_directory_path() / ("gale_mtp_pp_ckpt_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  // Tied embeddings and learned positions: the last stage's copies of both stay equal to the first's.
  std::vector<std::string> gpt = pretrain({"--mtp-num-layers", "2", "--mtp-loss-scaling-factor", "0.2"});
  gpt.erase(gpt.begin());  // the binary: launch_argv puts it after mpirun's flags
  for (const char* llama : {"--position-embedding-type", "--untie-embeddings-and-output-weights"}) {
    auto at = std::find(gpt.begin(), gpt.end(), llama);
    gpt.erase(at, at + (std::string(llama) == "--position-embedding-type" ? 2 : 1));
  }
  auto run = [&](int np, std::vector<std::string> extra) {
    std::vector<std::string> program = {GALE_BINARY};
    program.insert(program.end(), gpt.begin(), gpt.end());
    if (np > 1) extra.insert(extra.end(), {"--pipeline-model-parallel-size", "2"});
    return test::run_with_timeout(testing::launch_argv(np, program, extra), testing::kMpiEnv, 300);
  };
  test::RunResult whole = run(2, {});
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  const std::vector<double> lm = testing::logged_values(whole.output, "lm loss");
  const std::vector<double> m1 = testing::logged_values(whole.output, "mtp_1 loss");
  const std::vector<double> m2 = testing::logged_values(whole.output, "mtp_2 loss");
  ASSERT_EQ(lm.size(), 6u) << whole.output;  // one log line per iteration: the last rank's
  ASSERT_EQ(m1.size(), 6u) << whole.output;
  ASSERT_EQ(m2.size(), 6u) << whole.output;
  EXPECT_GT(m1.front(), 1.0);
  EXPECT_GT(m2.front(), 1.0);

  test::RunResult first = run(2, {"--save", dir.string(), "--save-interval", "3", "--exit-interval", "3"});
  ASSERT_EQ(first.exit_code, 0) << first.output;
  for (int np : {2, 1}) {
    test::RunResult second = run(np, {"--load", dir.string()});
    ASSERT_EQ(second.exit_code, 0) << second.output;
    const std::vector<double> lm_b = testing::logged_values(second.output, "lm loss");
    const std::vector<double> m1_b = testing::logged_values(second.output, "mtp_1 loss");
    const std::vector<double> m2_b = testing::logged_values(second.output, "mtp_2 loss");
    ASSERT_EQ(lm_b.size(), 3u) << second.output;
    ASSERT_EQ(m1_b.size(), 3u) << second.output;
    ASSERT_EQ(m2_b.size(), 3u) << second.output;
    // The same layout: the same numbers; one process: the same run up to summation order.
    const double tolerance = np == 2 ? 0.0 : 1e-4;
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_NEAR(lm[3 + i], lm_b[i], tolerance * lm[3 + i]) << "np " << np << ", iteration " << 4 + i;
      EXPECT_NEAR(m1[3 + i], m1_b[i], tolerance * m1[3 + i]) << "np " << np << ", iteration " << 4 + i;
      EXPECT_NEAR(m2[3 + i], m2_b[i], tolerance * m2[3 + i]) << "np " << np << ", iteration " << 4 + i;
    }
  }
  // `gale generate` loads the checkpoint saved at PP 2 (in one process, without the MTP layers).
  std::vector<std::string> argv = {GALE_BINARY, "generate", "--load", dir.string(), "--use-checkpoint-args",
                                   "--prompt", "5 17 300 2 41", "--max-new-tokens", "4", "--temperature", "0",
                                   "--tokenizer-type", "NullTokenizer", "--vocab-size", "4096"};
  test::RunResult g = test::run_with_timeout(argv, {}, 300);
  ASSERT_EQ(g.exit_code, 0) << g.output;
  EXPECT_TRUE(std::regex_search(g.output, std::regex(R"(5 17 300 2 41( \d+){4}\n)"))) << g.output;
  std::filesystem::remove_all(dir);
}

TEST(GalePretrainMtp, BadValuesAreOneLineErrors) {
  test::RunResult r = test::run_with_timeout(pretrain({"--mtp-num-layers", "0"}), {}, 60);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--mtp-num-layers: expected at least 1, found 0"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace gale
