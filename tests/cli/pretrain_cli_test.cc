// `gale pretrain` as a user runs it: Megatron's log line, errors as one line with exit code 2,
// the same losses at every optimisation level, and saving then resuming through the CLI.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>

#include "kernels/cpu/gemm.h"
#include "subprocess.h"

namespace gale {
namespace {

std::vector<std::string> tiny(std::vector<std::string> extra) {
  std::vector<std::string> argv = {GALE_BINARY, "pretrain", "--num-layers", "2", "--hidden-size", "64",
                                   "--num-attention-heads", "4", "--seq-length", "32", "--max-position-embeddings",
                                   "32", "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", "6",
                                   "--lr", "3e-3", "--mock-data", "--vocab-size", "4096", "--log-interval", "1",
                                   "--eval-interval", "3", "--eval-iters", "1", "--num-threads", "1"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

std::vector<double> losses(const std::string& output) {
  std::vector<double> out;
  std::regex re(R"(\| lm loss: ([0-9.E+-]+) \|)");
  for (std::sregex_iterator it(output.begin(), output.end(), re), end; it != end; ++it) out.push_back(std::stod((*it)[1]));
  return out;
}

TEST(GalePretrain, PrintsMegatronsLogLineAndValidation) {
  test::RunResult r = test::run_with_timeout(tiny({"--log-throughput"}), {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::regex line(
      R"( \[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}\] iteration        6/       6 \| consumed samples:           24 \| elapsed time per iteration \(ms\): [0-9.]+ \| throughput per GPU \(TFLOP/s/GPU\): [0-9.]+ \| learning rate: [0-9.]+E[+-]\d\d \| global batch size:     4 \| lm loss: [0-9.]+E[+-]\d\d \| loss scale: 1\.0 \| grad norm: [0-9.]+ \| number of skipped iterations:   0 \| number of nan iterations:   0 \|)");
  EXPECT_TRUE(std::regex_search(r.output, line)) << r.output;
  EXPECT_NE(r.output.find(" validation loss at iteration 3 | lm loss value: "), std::string::npos);
  EXPECT_NE(r.output.find(" validation loss at iteration 6 on test set | lm loss value: "), std::string::npos);
  EXPECT_NE(r.output.find("GEMM: oneDNN"), std::string::npos);
  // Megatron's print_datetime (main: '%Y-%m-%d %H:%M:%S.%f') before train()'s loop and after it
  // returns, before the final evaluations.
  std::smatch before, after;
  ASSERT_TRUE(std::regex_search(
      r.output, before, std::regex(R"(\[before the start of training step\] datetime: \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6} \n)")))
      << r.output;
  ASSERT_TRUE(std::regex_search(
      r.output, after, std::regex(R"(\[after training is done\] datetime: \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6} \n)")))
      << r.output;
  EXPECT_LT(static_cast<size_t>(before.position(0)), r.output.find("] iteration        1/       6 |"));
  EXPECT_GT(static_cast<size_t>(after.position(0)), r.output.find("] iteration        6/       6 |"));
  EXPECT_LT(static_cast<size_t>(after.position(0)), r.output.find(" validation loss at iteration 6 on test set |"));
  std::vector<double> l = losses(r.output);
  ASSERT_EQ(l.size(), 6u);
  EXPECT_LT(l.back(), l.front());  // the mock data is learnable
}

TEST(GalePretrain, SameLossesAtEveryOptimizationLevel) {
  std::vector<std::string> llama = {"--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope",
                                    "--disable-bias-linear", "--attention-dropout", "0.1", "--hidden-dropout", "0.1"};
  auto run = [&](std::vector<std::string> level) {
    std::vector<std::string> flags = llama;
    flags.insert(flags.end(), level.begin(), level.end());
    test::RunResult r = test::run_with_timeout(tiny(flags), {}, 300);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return losses(r.output);
  };
  std::vector<double> l0 = run({"--optimization-level", "0"});
  std::vector<double> l1 = run({"--optimization-level", "1"});
  std::vector<double> l2 = run({"--use-flash-attn", "--use-fused-rmsnorm", "--use-fused-swiglu",
                                "--use-fused-rotary-pos-emb", "--cross-entropy-loss-fusion"});
  ASSERT_EQ(l0.size(), 6u);
  ASSERT_EQ(l1.size(), 6u);
  ASSERT_EQ(l2.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_NEAR(l1[i], l0[i], 1e-4 * l0[i]) << "iteration " << i + 1;
    EXPECT_NEAR(l2[i], l0[i], 1e-4 * l0[i]) << "iteration " << i + 1;
  }
}

TEST(GalePretrain, RecomputationKeepsTheLossesAndSaysItIsActive) {
  test::RunResult kept = test::run_with_timeout(tiny({"--use-flash-attn"}), {}, 300);
  test::RunResult recomputed = test::run_with_timeout(
      tiny({"--use-flash-attn", "--recompute-activation-function", "--recompute-norm", "--recompute-norm-num-layers",
            "1"}),
      {}, 300);
  ASSERT_EQ(kept.exit_code, 0) << kept.output;
  ASSERT_EQ(recomputed.exit_code, 0) << recomputed.output;
  EXPECT_NE(recomputed.output.find("active: recompute-activation-function (memory, level 2)"), std::string::npos)
      << recomputed.output;
  EXPECT_NE(recomputed.output.find("active: recompute-norm (memory, level 2)"), std::string::npos);
  ASSERT_EQ(losses(kept.output).size(), 6u);
  EXPECT_EQ(losses(recomputed.output), losses(kept.output));  // bit-identical, so identical when printed
}

TEST(GalePretrain, Bf16TrainsOnEitherGemmPathAndSaysWhich) {
  // --bf16 uses oneDNN's bf16 matmul only where it runs on AMX or AVX512-BF16, else f32 sgemm on widened inputs;
  // both multiply the same bf16 values, so the losses agree closely.
  // Where oneDNN has no bf16 matmul for the CPU (AVX2 only), forcing it is a clear start-up error.
  test::RunResult matmul = test::run_with_timeout(tiny({"--bf16"}), {"GALE_BF16_GEMM=matmul"}, 300);
  test::RunResult sgemm = test::run_with_timeout(tiny({"--bf16"}), {"GALE_BF16_GEMM=sgemm"}, 300);
  ASSERT_EQ(sgemm.exit_code, 0) << sgemm.output;
  EXPECT_NE(sgemm.output.find("GEMM (--bf16): f32 sgemm on bf16 inputs widened to f32"), std::string::npos)
      << sgemm.output;
  std::vector<double> b = losses(sgemm.output);
  ASSERT_EQ(b.size(), 6u);
  EXPECT_LT(b.back(), b.front());
  if (bf16_matmul_available()) {
    ASSERT_EQ(matmul.exit_code, 0) << matmul.output;
    EXPECT_NE(matmul.output.find("GEMM (--bf16): oneDNN bf16 matmul ("), std::string::npos) << matmul.output;
    std::vector<double> a = losses(matmul.output);
    ASSERT_EQ(a.size(), 6u);
    for (size_t i = 0; i < 6; ++i) EXPECT_NEAR(b[i], a[i], 1e-3 * a[i]) << "iteration " << i + 1;
  } else {
    EXPECT_EQ(matmul.exit_code, 2) << matmul.output;
    EXPECT_NE(matmul.output.find("GALE_BF16_GEMM=matmul: oneDNN"), std::string::npos) << matmul.output;
    EXPECT_NE(matmul.output.find("has no bf16 matmul for this CPU"), std::string::npos) << matmul.output;
  }

  test::RunResult bad = test::run_with_timeout(tiny({"--bf16"}), {"GALE_BF16_GEMM=fast"}, 300);
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.output.find("GALE_BF16_GEMM: expected matmul, sgemm or auto, found 'fast'"), std::string::npos)
      << bad.output;
}

TEST(GalePretrain, SaveThenResumeThroughTheCli) {
  auto dir = std::filesystem::temp_directory_path() / ("gale_cli_ckpt_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  test::RunResult whole = test::run_with_timeout(tiny({}), {}, 300);
  test::RunResult first =
      test::run_with_timeout(tiny({"--save", dir.string(), "--save-interval", "3", "--exit-interval", "3"}), {}, 300);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_NE(first.output.find("exiting program at iteration 3"), std::string::npos);
  test::RunResult second = test::run_with_timeout(tiny({"--load", dir.string()}), {}, 300);
  ASSERT_EQ(second.exit_code, 0) << second.output;
  std::vector<double> a = losses(whole.output), b = losses(second.output);
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(a[3 + i], b[i]) << "iteration " << 4 + i;  // printed digits equal
  std::filesystem::remove_all(dir);
}

// Megatron's --use-checkpoint-args: the model flags come from the checkpoint's args, so a resume
// that leaves them out continues exactly; a --num-layers given on the command line still wins (and
// then does not match the checkpoint).
TEST(GalePretrain, UseCheckpointArgsTakesTheModelFlagsFromTheCheckpoint) {
  auto dir = std::filesystem::temp_directory_path() / ("gale_cli_ckpt_args_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const std::vector<std::string> model = {"--swiglu", "--normalization", "RMSNorm", "--disable-bias-linear",
                                          "--position-embedding-type", "rope", "--group-query-attention",
                                          "--num-query-groups", "2", "--untie-embeddings-and-output-weights"};
  std::vector<std::string> save = model;
  save.insert(save.end(), {"--save", dir.string(), "--save-interval", "3", "--exit-interval", "3"});
  test::RunResult whole = test::run_with_timeout(tiny(model), {}, 300);
  test::RunResult first = test::run_with_timeout(tiny(save), {}, 300);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  // Only training flags: no model shape, no --swiglu/RMSNorm/rope/GQA/untied flags.
  const std::vector<std::string> training = {GALE_BINARY, "pretrain", "--micro-batch-size", "2", "--global-batch-size",
                                             "4", "--train-iters", "6", "--lr", "3e-3", "--mock-data", "--vocab-size",
                                             "4096", "--log-interval", "1", "--eval-interval", "3", "--eval-iters", "1",
                                             "--num-threads", "1", "--load", dir.string(), "--use-checkpoint-args"};
  test::RunResult second = test::run_with_timeout(training, {}, 300);
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_NE(second.output.find("Setting num_layers to 2 from checkpoint"), std::string::npos) << second.output;
  EXPECT_NE(second.output.find("Setting swiglu to True from checkpoint"), std::string::npos) << second.output;
  EXPECT_NE(second.output.find("Setting normalization to RMSNorm from checkpoint"), std::string::npos);
  std::vector<double> a = losses(whole.output), b = losses(second.output);
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(a[3 + i], b[i]) << "iteration " << 4 + i;
  std::vector<std::string> deeper = training;
  deeper.insert(deeper.end(), {"--num-layers", "3"});
  test::RunResult third = test::run_with_timeout(deeper, {}, 300);
  EXPECT_NE(third.exit_code, 0) << third.output;
  EXPECT_EQ(third.output.find("Setting num_layers"), std::string::npos) << third.output;
  EXPECT_NE(third.output.find("num_layers"), std::string::npos) << third.output;  // the mismatch error
  std::filesystem::remove_all(dir);
}

struct CliError {
  std::vector<std::string> extra;
  std::string message;
};

TEST(GalePretrain, ErrorsAreOneLineWithExitCode2) {
  const CliError cases[] = {
      {{"--num-layerz", "2"}, "gale pretrain: error: unknown flag --num-layerz (run `gale pretrain --help` for the list)"},
      {{"--hidden-size", "66"},
       "gale pretrain: error: --hidden-size 66 must be divisible by --num-attention-heads 4 (or give --kv-channels)"},
      {{"--min-lr", "1"}, "gale pretrain: error: --min-lr 1 must not exceed --lr 0.003"},
      {{"--save", "/tmp/x"}, "gale pretrain: error: --save needs --save-interval (iterations between checkpoints)"},
      {{"--global-batch-size", "3"},
       "gale pretrain: error: --global-batch-size 3 must be a multiple of --micro-batch-size 2 times the data-parallel "
       "size 1"},
      {{"--fp16", "--bf16"}, "gale pretrain: error: --fp16 and --bf16 are exclusive: give one of them"},
      {{"--use-checkpoint-args"}, "gale pretrain: error: --use-checkpoint-args requires --load argument"},
      {{"--use-fused-swiglu"},
       "gale pretrain: error: --use-fused-swiglu requires --swiglu (or GeGLU: --geglu, --gelu-tanh)"},
      {{"--tensor-model-parallel-size", "2"},
       "gale pretrain: error: world size 1 is not divisible by --tensor-model-parallel-size 2 x "
       "--pipeline-model-parallel-size 1 x --context-parallel-size 1 = 2"},
  };
  for (const CliError& c : cases) {
    test::RunResult r = test::run_with_timeout(tiny(c.extra), {}, 60);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_EQ(r.output, c.message + "\n");
  }
  std::vector<std::string> no_lr = tiny({});
  for (size_t i = 0; i < no_lr.size(); ++i)
    if (no_lr[i] == "--lr") no_lr.erase(no_lr.begin() + static_cast<long>(i), no_lr.begin() + static_cast<long>(i) + 2);
  test::RunResult r = test::run_with_timeout(no_lr, {}, 60);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output, "gale pretrain: error: --lr is required\n");
}

TEST(GalePretrain, CompatibilityFlagsAreAcceptedWithANote) {
  test::RunResult r = test::run_with_timeout(
      tiny({"--use-mcore-models", "--attention-softmax-in-fp32", "--initial-loss-scale", "65536",
            "--deterministic-mode", "--attention-backend", "auto", "--no-overlap-p2p-communication",
            "--ckpt-fully-parallel-load", "--check-for-nan-in-loss-and-grad", "--train-iters", "1"}),
      {}, 120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("accepted without effect: --initial-loss-scale: loss scaling only applies with --fp16"),
            std::string::npos)
      << r.output;
  for (const char* flag : {"--deterministic-mode: ", "--attention-backend: ", "--no-overlap-p2p-communication: ",
                           "--ckpt-fully-parallel-load: "})
    EXPECT_NE(r.output.find(std::string("accepted without effect: ") + flag), std::string::npos) << flag << r.output;
}

}  // namespace
}  // namespace gale
