// `gale pretrain --fp16` as Megatron users run it: dynamic loss scaling from 2^32 skips the
// overflowing first iterations and halves the scale as Megatron does, a constant --loss-scale
// trains close to fp32, a resumed run continues the loss scale exactly, tensor (sequence) and
// data parallelism under mpirun skip the same iterations and train like one process, and bad flags
// are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <regex>
#include <sstream>

#include "cli/cli_test_util.h"
#include "cli/log_line.h"
#include "cli/mpi_cli.h"
#include "subprocess.h"
#include "data/data_test_util.h"

namespace gale {
namespace {

const std::string kModel =
    "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 "
    "--tokenizer-type NullTokenizer --vocab-size 4096 --micro-batch-size 2 --global-batch-size 4 --lr 3e-3 "
    "--mock-data --eval-iters 0 --num-threads 1 --log-interval 1";

using testing::logged_values;

TEST(Fp16Cli, DynamicScalingSkipsOverflowsAndHalvesTheScaleAsMegatron) {
  testing::TempDir dir;
  testing::CommandResult r = testing::run_gale("pretrain " + kModel + " --fp16 --train-iters 30", dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("GEMM (--fp16): f16 inputs widened to f32"), std::string::npos) << r.out;
  EXPECT_NE((r.out + r.err).find("--check-for-nan-in-loss-and-grad is off"), std::string::npos);
  const std::vector<double> scale = logged_values(r.out, "loss scale");
  const std::vector<double> skipped = logged_values(r.out, "number of skipped iterations");
  const std::vector<double> nan = logged_values(r.out, "number of nan iterations");
  ASSERT_EQ(scale.size(), 30u);
  ASSERT_EQ(skipped.size(), 30u);
  // Megatron's rule with --hysteresis 2: the first overflow keeps 2^32, each further one halves it;
  // the first iteration that does not overflow keeps the scale and trains.
  double expected = 4294967296.0;
  int hysteresis = 2, first_trained = -1;
  for (int i = 0; i < 30 && first_trained < 0; ++i) {
    if (skipped[i] == 1.0) {
      if (--hysteresis <= 0) expected /= 2;
    } else {
      first_trained = i;
    }
    EXPECT_EQ(scale[i], expected) << "iteration " << i + 1;
    EXPECT_EQ(nan[i], 0.0) << "an overflow is not a NaN iteration";
  }
  ASSERT_GT(first_trained, 2) << "the tiny model should overflow f16 at 2^32 for a few iterations";
  ASSERT_LT(first_trained, 28) << r.out;
  // Skipped iterations print neither a loss nor a gradient norm (Megatron); trained ones do, and
  // every later iteration trains at this scale (growth comes only after --loss-scale-window 1000).
  const std::vector<double> loss = logged_values(r.out, "lm loss"), norm = logged_values(r.out, "grad norm");
  EXPECT_EQ(loss.size(), static_cast<size_t>(30 - first_trained));
  EXPECT_EQ(norm.size(), loss.size());
  for (double l : loss) EXPECT_TRUE(std::isfinite(l) && l > 0.0);
  EXPECT_LT(loss.back(), loss.front());  // it learns
}

// Megatron's training_log with MoE under fp16 from 2^32: its total_loss_dict gets the MoE
// tracker's key at the first (skipped) iteration and "lm loss" only at the first advanced one, so
// the skipped lines print load_balancing_loss and no lm loss, and every later line prints
// load_balancing_loss before lm loss (the dict's insertion order). A skipped iteration adds its
// forward's finite router value, as Megatron's tracker (docs/formats/log-line.md).
TEST(Fp16Cli, MoeTrackerKeyEntersTheLineBeforeLmLossWhenTheFirstIterationIsSkipped) {
  testing::TempDir dir;
  testing::CommandResult r = testing::run_gale(
      "pretrain " + kModel +
          " --fp16 --train-iters 20 --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 64 "
          "--moe-aux-loss-coeff 1e-2 --moe-token-dispatcher-type alltoall",
      dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  std::vector<std::string> lines;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);)
    if (line.find("| consumed samples:") != std::string::npos) lines.push_back(line);
  ASSERT_EQ(lines.size(), 20u) << r.out;
  const std::regex skipped_line(R"(\| global batch size:     4 \| load_balancing_loss: [0-9.]+E[+-]\d\d \| loss scale: [0-9.]+ \| number of skipped iterations:   1 \|)");
  const std::regex trained_line(
      R"(\| global batch size:     4 \| load_balancing_loss: [0-9.]+E[+-]\d\d \| lm loss: [0-9.]+E[+-]\d\d \| loss scale: [0-9.]+ \| grad norm: [0-9.]+ \| number of skipped iterations:   0 \|)");
  ASSERT_TRUE(std::regex_search(lines[0], skipped_line)) << lines[0];
  // The first line is one skipped iteration: its value is that forward's (about 1 for a near-uniform router).
  EXPECT_GT(logged_values(lines[0], "load_balancing_loss").front(), 0.5) << lines[0];
  size_t trained = 0;
  for (const std::string& line : lines) {
    if (std::regex_search(line, trained_line)) {
      ++trained;
    } else {
      EXPECT_TRUE(std::regex_search(line, skipped_line)) << line;
    }
  }
  EXPECT_GT(trained, 0u) << r.out;
  EXPECT_GT(logged_values(r.out, "load_balancing_loss").back(), 0.5) << r.out;
}

TEST(Fp16Cli, ConstantLossScaleTrainsCloseToFp32) {
  testing::TempDir dir;
  testing::CommandResult f32 = testing::run_gale("pretrain " + kModel + " --train-iters 6", dir.path());
  ASSERT_EQ(f32.exit_code, 0) << f32.err;
  testing::CommandResult h = testing::run_gale("pretrain " + kModel + " --fp16 --loss-scale 1024 --train-iters 6", dir.path());
  ASSERT_EQ(h.exit_code, 0) << h.err;
  const std::vector<double> a = logged_values(f32.out, "lm loss"), b = logged_values(h.out, "lm loss");
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_NEAR(b[i], a[i], 2e-3 * a[i]) << "iteration " << i + 1;
  EXPECT_NE(a, b);  // the f16 rounding really happened
  for (double s : logged_values(h.out, "loss scale")) EXPECT_EQ(s, 1024.0);
  EXPECT_EQ(h.err.find("--check-for-nan-in-loss-and-grad is off"), std::string::npos);
}

TEST(Fp16Cli, ResumedRunContinuesTheLossScaleExactly) {
  // A small window makes the scale grow within the run, so both trackers matter on resume.
  const std::string flags =
      " --fp16 --initial-loss-scale 1048576 --loss-scale-window 3 --hysteresis 1 --train-iters 12";
  testing::TempDir dir;
  testing::CommandResult whole = testing::run_gale("pretrain " + kModel + flags, dir.path());
  ASSERT_EQ(whole.exit_code, 0) << whole.err;
  const std::string ckpt = dir.file("ckpt");
  testing::CommandResult first =
      testing::run_gale("pretrain " + kModel + flags + " --exit-interval 6 --save-interval 100 --save " + ckpt, dir.path());
  ASSERT_EQ(first.exit_code, 0) << first.err;
  testing::CommandResult second =
      testing::run_gale("pretrain " + kModel + flags + " --load " + ckpt, dir.path());
  ASSERT_EQ(second.exit_code, 0) << second.err;
  const std::vector<double> scale = logged_values(whole.out, "loss scale");
  ASSERT_EQ(scale.size(), 12u);
  std::vector<double> tail(scale.begin() + 6, scale.end());
  EXPECT_EQ(logged_values(second.out, "loss scale"), tail);
  // The scale moved during the run (grew after clean windows or shrank after an overflow).
  EXPECT_NE(*std::min_element(scale.begin(), scale.end()), *std::max_element(scale.begin(), scale.end()));
  const std::vector<double> loss = logged_values(whole.out, "lm loss"), resumed = logged_values(second.out, "lm loss");
  ASSERT_GE(loss.size(), resumed.size());
  ASSERT_FALSE(resumed.empty());
  EXPECT_EQ(resumed, std::vector<double>(loss.end() - static_cast<std::ptrdiff_t>(resumed.size()), loss.end()));
}

// Runs `gale pretrain` with the tiny model (vocabulary 4096: no padding at TP 1 or 2, so the
// layouts hold the same model), --fp16, `flags` and `extra` on `np` ranks under mpirun.
test::RunResult run_fp16(int np, const std::string& flags, const std::vector<std::string>& extra = {}) {
  std::string model = kModel;
  model.replace(model.find("--vocab-size 4096"), 17, "--vocab-size 4095");
  std::vector<std::string> pretrain = {GALE_BINARY, "pretrain"};
  std::istringstream words(model + " --fp16 " + flags);
  for (std::string w; words >> w;) pretrain.push_back(w);
  return test::run_with_timeout(testing::launch_argv(np, pretrain, extra), testing::kMpiEnv, 300);
}

// f16 GEMM inputs all-gathered over the sequence-parallel group: both TP ranks must agree on each
// overflow, so the loss-scale sequence is one process's, and the losses are close to it.
TEST(Fp16Cli, TensorParallelSkipsTheSameIterationsAsOneProcess) {
  test::RunResult one = run_fp16(1, "--train-iters 16");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const std::vector<double> scale = logged_values(one.output, "loss scale"), loss = logged_values(one.output, "lm loss");
  ASSERT_EQ(scale.size(), 16u);
  ASSERT_GE(loss.size(), 3u);
  test::RunResult tp = run_fp16(2, "--train-iters 16", {"--tensor-model-parallel-size", "2", "--sequence-parallel"});
  ASSERT_EQ(tp.exit_code, 0) << tp.output;
  EXPECT_EQ(logged_values(tp.output, "loss scale"), scale);
  const std::vector<double> l = logged_values(tp.output, "lm loss");
  ASSERT_EQ(l.size(), loss.size());
  for (size_t i = 0; i < l.size(); ++i) EXPECT_NEAR(l[i], loss[i], 1e-4 * loss[i]) << "logged loss " << i;
}

// The distributed optimizer: each data-parallel rank unscales its own shard of the reduced
// gradients. With a constant scale the run equals one process's; with dynamic scaling the ranks
// agree on every overflow (the norm is summed over them) and follow Megatron's rule. Each rank's
// micro-batch gradient is twice one process's before the data-parallel average (as in Megatron),
// so the overflows may come one halving later than with one process.
TEST(Fp16Cli, DistributedOptimizerUnscalesItsShards) {
  test::RunResult one = run_fp16(1, "--loss-scale 1024 --train-iters 6");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  test::RunResult dp = run_fp16(2, "--loss-scale 1024 --train-iters 6", {"--use-distributed-optimizer"});
  ASSERT_EQ(dp.exit_code, 0) << dp.output;
  const std::vector<double> a = logged_values(one.output, "lm loss"), b = logged_values(dp.output, "lm loss");
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_NEAR(b[i], a[i], 1e-4 * a[i]) << "iteration " << i + 1;
  // Adam hardly notices a gradient scale; the unscaled norm does.
  const std::vector<double> na = logged_values(one.output, "grad norm"), nb = logged_values(dp.output, "grad norm");
  ASSERT_EQ(na.size(), 6u);
  ASSERT_EQ(nb.size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_NEAR(nb[i], na[i], 1e-2 * na[i]) << "iteration " << i + 1;
  test::RunResult dynamic = run_fp16(2, "--train-iters 16", {"--use-distributed-optimizer"});
  ASSERT_EQ(dynamic.exit_code, 0) << dynamic.output;
  const std::vector<double> scale = logged_values(dynamic.output, "loss scale");
  const std::vector<double> skipped = logged_values(dynamic.output, "number of skipped iterations");
  ASSERT_EQ(scale.size(), 16u);
  ASSERT_EQ(skipped.size(), 16u);
  EXPECT_EQ(scale[0], 4294967296.0);
  for (size_t i = 1; i < 16; ++i)
    EXPECT_EQ(scale[i], skipped[i] == 1.0 ? scale[i - 1] / 2 : scale[i - 1]) << "iteration " << i + 1;
  EXPECT_EQ(skipped.back(), 0.0);
}

TEST(Fp16Cli, BadFlagsAreRefusedAndStrayLossScaleFlagsNoted) {
  testing::TempDir dir;
  testing::CommandResult r = testing::run_gale("pretrain " + kModel + " --fp16 --bf16 --train-iters 1", dir.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--fp16 and --bf16 are exclusive"), std::string::npos) << r.err;
  r = testing::run_gale("pretrain " + kModel + " --fp16 --loss-scale -4 --train-iters 1", dir.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--loss-scale: expected a positive number, found -4"), std::string::npos) << r.err;
  r = testing::run_gale("pretrain " + kModel + " --fp16 --hysteresis 0 --train-iters 1", dir.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--hysteresis: expected a positive integer, found 0"), std::string::npos) << r.err;
  r = testing::run_gale("pretrain " + kModel + " --loss-scale 8 --train-iters 1", dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE((r.out + r.err).find("accepted without effect: --loss-scale: loss scaling only applies with --fp16"),
            std::string::npos)
      << r.out << r.err;
}

}  // namespace
}  // namespace gale
