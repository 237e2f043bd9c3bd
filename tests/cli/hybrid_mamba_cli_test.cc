// `gale pretrain --is-hybrid-model` (Megatron's pretrain_mamba.py): a falling loss on the mock data,
// data, pipeline, tensor (+ sequence) and context parallelism 2 (mpirun) reproduce the one-process losses,
// save and resume continue the same run bit for bit, and what is not supported yet is refused in
// one line naming the flag.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include "mpi_cli.h"
#include "subprocess.h"

namespace gale {
namespace {

// A tiny all-Mamba model: 2 layers, hidden 64 (d_inner 128: 8 heads of 16, 2 groups, d_state 16),
// no position embedding, micro-batches of 1 (2 per rank at DP 2), one thread per rank.
std::vector<std::string> mamba(int np, int iters, std::vector<std::string> extra) {
  std::vector<std::string> flags = {
      "--is-hybrid-model", "--mamba-state-dim", "16", "--mamba-head-dim", "16", "--mamba-num-groups", "2",
      "--normalization", "RMSNorm", "--position-embedding-type", "none", "--hidden-dropout", "0.0",
      "--lr", "1e-2", "--lr-decay-style", "constant", "--log-interval", "1"};
  return testing::tiny_gpt_pretrain(np, iters, flags, extra);
}

std::vector<double> losses(const std::string& output) {
  std::vector<double> out;
  std::regex re(R"(\| lm loss: ([0-9.E+-]+) \|)");
  for (std::sregex_iterator it(output.begin(), output.end(), re), end; it != end; ++it) out.push_back(std::stod((*it)[1]));
  return out;
}

test::RunResult run(const std::vector<std::string>& argv, int np = 1) {
  return test::run_with_timeout(argv, np > 1 ? testing::kMpiEnv : std::vector<std::string>{}, 600);
}

// Four layers "M*-M" (an attention and an MLP layer between Mamba layers; their gradients:
// tests/model/hybrid_model_test.cc): the loss falls, and DP 2 (each rank 2 of the 4 samples) gives
// the one-process losses: the gradients differ only in the order of one sum (the all-reduce), ~1e-7
// relative per step, which 16 Adam steps leave far below 1e-4 of the loss.
TEST(GalePretrainHybridMamba, LearnsAndDataAndPipelineParallelMatchOneProcess) {
  const std::vector<std::string> pattern = {"--num-layers", "4", "--hybrid-override-pattern", "M*-M"};
  test::RunResult one = run(mamba(1, 16, pattern));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_NE(one.output.find("Hybrid allocation (M is mamba, * is attention, - is mlp): M*-M (1 attention, 1 mlp, 2 "
                            "mamba layers)"),
            std::string::npos)
      << one.output;
  const std::vector<double> l = losses(one.output);
  ASSERT_EQ(l.size(), 16u);
  const double first = (l[0] + l[1] + l[2] + l[3]) / 4, last = (l[12] + l[13] + l[14] + l[15]) / 4;
  EXPECT_LT(last, first - 0.15) << one.output;
  test::RunResult two = run(mamba(2, 16, pattern), 2);
  ASSERT_EQ(two.exit_code, 0) << two.output;
  const std::vector<double> l2 = losses(two.output);
  ASSERT_EQ(l2.size(), 16u);
  for (size_t i = 0; i < l.size(); ++i) EXPECT_NEAR(l2[i], l[i], 1e-4 * l[i]) << "iteration " << i + 1;
  // Pipeline parallelism 2 ("M*" and "-M" on the two stages; Megatron's MambaStack selects its
  // layers from the whole allocation too): the same arithmetic, so the same losses.
  std::vector<std::string> pp = pattern;
  pp.insert(pp.end(), {"--pipeline-model-parallel-size", "2"});
  test::RunResult staged = run(mamba(2, 16, pp), 2);
  ASSERT_EQ(staged.exit_code, 0) << staged.output;
  const std::vector<double> lp = losses(staged.output);
  ASSERT_EQ(lp.size(), 16u);
  for (size_t i = 0; i < l.size(); ++i) EXPECT_NEAR(lp[i], l[i], 1e-5 * l[i]) << "iteration " << i + 1;
  // Tensor parallelism 2 with sequence parallelism (each rank 4 heads in 1 group; the invariance of
  // the gradients: tests/parallel/hybrid_invariance_mpi_test.cc): the sums run in another order, as DP's.
  // Megatron pads the vocabulary to a multiple of 128·TP: 64·2 keeps the one-process run's 4224 rows.
  std::vector<std::string> tp = pattern;
  tp.insert(tp.end(), {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--make-vocab-size-divisible-by",
                       "64"});
  test::RunResult split = run(mamba(2, 16, tp), 2);
  ASSERT_EQ(split.exit_code, 0) << split.output;
  const std::vector<double> lt = losses(split.output);
  ASSERT_EQ(lt.size(), 16u);
  for (size_t i = 0; i < l.size(); ++i) EXPECT_NEAR(lt[i], l[i], 1e-4 * l[i]) << "iteration " << i + 1;
  // Context parallelism 2 (each rank 16 positions of every sample; the Mamba layers' all-to-alls give
  // each rank whole sequences of 4 heads in 1 group, the attention layer runs the ring; the invariance
  // of the gradients: tests/parallel/hybrid_invariance_mpi_test.cc).
  std::vector<std::string> cp = pattern;
  cp.insert(cp.end(), {"--context-parallel-size", "2"});
  test::RunResult ring = run(mamba(2, 16, cp), 2);
  ASSERT_EQ(ring.exit_code, 0) << ring.output;
  const std::vector<double> lc = losses(ring.output);
  ASSERT_EQ(lc.size(), 16u);
  for (size_t i = 0; i < l.size(); ++i) EXPECT_NEAR(lc[i], l[i], 1e-4 * l[i]) << "iteration " << i + 1;
}

// Megatron main's --hybrid-layer-pattern with '|': "M*-|M*" puts 3 layers on the first pipeline
// stage and 2 on the second (5 layers, which the even split would refuse at PP 2); the staged run
// gives the one-process losses of the same model without the separator.
TEST(GalePretrainHybridMamba, LayerPatternPipeStagesMatchOneProcess) {
  test::RunResult one = run(mamba(1, 8, {"--hybrid-layer-pattern", "M*-M*"}));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const std::vector<double> l = losses(one.output);
  ASSERT_EQ(l.size(), 8u);
  test::RunResult staged =
      run(mamba(2, 8, {"--hybrid-layer-pattern", "M*-|M*", "--pipeline-model-parallel-size", "2"}), 2);
  ASSERT_EQ(staged.exit_code, 0) << staged.output;
  EXPECT_NE(staged.output.find("M*-M*"), std::string::npos) << staged.output;  // the allocation report
  const std::vector<double> lp = losses(staged.output);
  ASSERT_EQ(lp.size(), 8u);
  for (size_t i = 0; i < l.size(); ++i) EXPECT_NEAR(lp[i], l[i], 1e-5 * l[i]) << "iteration " << i + 1;
  // Without the separator, 5 layers do not split evenly over 2 stages.
  test::RunResult even = run(mamba(2, 1, {"--hybrid-layer-pattern", "M*-M*", "--pipeline-model-parallel-size", "2"}), 2);
  EXPECT_NE(even.exit_code, 0);
  EXPECT_NE(even.output.find("must be divisible by --pipeline-model-parallel-size 2"), std::string::npos)
      << even.output;
}

// Gated DeltaNet layers ('G', Megatron-Core main's gdn_layer) beside Mamba, MLP and attention layers,
// "MG-*": the loss falls, the allocation report names them, and pipeline parallelism 2 ("MG" and "-*")
// and tensor parallelism 2 with sequence parallelism (each rank 1 of the 2 key heads and 2 of the 4
// value heads) give the one-process losses.
TEST(GalePretrainHybridMamba, GatedDeltaNetLayersLearnAndSplitOverPipelineAndTensorParallelism) {
  const std::vector<std::string> pattern = {
      "--num-layers", "4", "--hybrid-override-pattern", "MG-*", "--swiglu", "--linear-num-key-heads", "2",
      "--linear-num-value-heads", "4", "--linear-key-head-dim", "16", "--linear-value-head-dim", "16"};
  // At --lr 1e-2 this model's loss jumps by up to 1 between steps, which grows last-bit differences
  // (~1e-7 relative up to step 12) to 1e-5 (PP) and 2e-4 (TP) by step 16: the first 12 steps are compared.
  constexpr size_t kCompared = 12;
  test::RunResult one = run(mamba(1, 16, pattern));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_NE(one.output.find("Hybrid allocation (M is mamba, * is attention, - is mlp, G is gdn): MG-* (1 attention, "
                            "1 mlp, 1 gdn, 1 mamba layers)"),
            std::string::npos)
      << one.output;
  const std::vector<double> l = losses(one.output);
  ASSERT_EQ(l.size(), 16u);
  const double first = (l[0] + l[1] + l[2] + l[3]) / 4, last = (l[12] + l[13] + l[14] + l[15]) / 4;
  EXPECT_LT(last, first - 0.15) << one.output;
  std::vector<std::string> pp = pattern;
  pp.insert(pp.end(), {"--pipeline-model-parallel-size", "2"});
  test::RunResult staged = run(mamba(2, 16, pp), 2);
  ASSERT_EQ(staged.exit_code, 0) << staged.output;
  const std::vector<double> lp = losses(staged.output);
  ASSERT_EQ(lp.size(), 16u);
  for (size_t i = 0; i < kCompared; ++i) EXPECT_NEAR(lp[i], l[i], 1e-5 * l[i]) << "iteration " << i + 1;
  std::vector<std::string> tp = pattern;
  tp.insert(tp.end(), {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--make-vocab-size-divisible-by",
                       "64"});
  test::RunResult split = run(mamba(2, 16, tp), 2);
  ASSERT_EQ(split.exit_code, 0) << split.output;
  const std::vector<double> lt = losses(split.output);
  ASSERT_EQ(lt.size(), 16u);
  for (size_t i = 0; i < kCompared; ++i) EXPECT_NEAR(lt[i], l[i], 1e-4 * l[i]) << "iteration " << i + 1;
}

// Recomputation reruns the same kernels with the same dropout masks: full (block, 3 of the 4
// layers) and selective (norms and MLPs) give the stored-activation run's losses exactly, and --bf16
// stays within bf16's precision of them.
TEST(GalePretrainHybridMamba, RecomputeIsExactAndBf16Close) {
  const std::vector<std::string> base = {"--num-layers", "4", "--hybrid-override-pattern", "M*-M", "--hidden-dropout",
                                         "0.1"};
  auto losses_of = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), base.begin(), base.end());
    test::RunResult r = run(mamba(1, 6, extra));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return losses(r.output);
  };
  const std::vector<double> plain = losses_of({});
  const std::vector<double> full =
      losses_of({"--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "3"});
  const std::vector<double> selective =
      losses_of({"--recompute-granularity", "selective", "--recompute-modules", "layernorm", "mlp"});
  const std::vector<double> bf16 = losses_of({"--bf16"});
  ASSERT_EQ(plain.size(), 6u);
  EXPECT_EQ(full, plain);
  EXPECT_EQ(selective, plain);
  ASSERT_EQ(bf16.size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_NEAR(bf16[i], plain[i], 1e-2 * plain[i]) << "iteration " << i + 1;
}

TEST(GalePretrainHybridMamba, SaveThenResumeContinuesTheSameRun) {
  auto dir = std::filesystem::temp_directory_path() / ("gale_mamba_ckpt_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  // pretrain_mamba.py's --spec names the model Gale builds: accepted, the same run.
  test::RunResult whole =
      run(mamba(1, 6, {"--spec", "megatron.core.models.mamba.mamba_layer_specs", "mamba_stack_spec"}));
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  test::RunResult first = run(mamba(1, 6, {"--save", dir.string(), "--save-interval", "3", "--exit-interval", "3"}));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  test::RunResult second = run(mamba(1, 6, {"--load", dir.string()}));
  ASSERT_EQ(second.exit_code, 0) << second.output;
  const std::vector<double> a = losses(whole.output), b = losses(second.output);
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(a[3 + i], b[i]) << "iteration " << 4 + i;
  // The checkpoint's args say it is a hybrid model: generation builds it with its Mamba decoding
  // state (tests/cli/hybrid_generate_cli_test.cc checks its texts).
  test::RunResult gen = run({GALE_BINARY, "generate", "--load", dir.string(), "--use-checkpoint-args",
                             "--tokenizer-type", "NullTokenizer", "--vocab-size", "4096", "--prompt", "5 17",
                             "--max-new-tokens", "2"});
  EXPECT_EQ(gen.exit_code, 0) << gen.output;
  EXPECT_TRUE(std::regex_search(gen.output, std::regex("\n5 17 \\d+ \\d+\n"))) << gen.output;
  // An all-Mamba model keeps no keys and values: static batching runs (Mamba slots only), dynamic
  // batching, whose buffer is sized in key/value blocks, is refused naming the flag.
  std::ofstream(dir / "prompts.txt") << "5 17\n3 4 5 6\n";
  const std::vector<std::string> batch = {GALE_BINARY, "generate", "--load", dir.string(), "--use-checkpoint-args",
                                          "--tokenizer-type", "NullTokenizer", "--vocab-size", "4096", "--prompts-file",
                                          (dir / "prompts.txt").string(), "--max-new-tokens", "2"};
  test::RunResult st = run(batch);
  EXPECT_EQ(st.exit_code, 0) << st.output;
  std::smatch alone;
  ASSERT_TRUE(std::regex_search(gen.output, alone, std::regex("5 17 \\d+ \\d+\n"))) << gen.output;
  EXPECT_TRUE(std::regex_search(st.output, std::regex("(^|\n)" + alone.str() + "3 4 5 6 \\d+ \\d+\n")))
      << "the first prompt's tokens alone, then the second's\n" << st.output;
  std::vector<std::string> dyn = batch;
  dyn.push_back("--inference-dynamic-batching");
  test::RunResult d = run(dyn);
  EXPECT_EQ(d.exit_code, 2) << d.output;
  EXPECT_NE(d.output.find("--inference-dynamic-batching with a hybrid model without attention layers"),
            std::string::npos)
      << d.output;
  // Nor is there a Hugging Face form of it yet.
  test::RunResult hf = run({GALE_BINARY, "convert", "--load-model-type", "gale", "--save-model-type", "hf",
                            "--load-dir", dir.string(), "--save-dir", (dir / "hf").string()});
  EXPECT_NE(hf.exit_code, 0) << hf.output;
  EXPECT_NE(hf.output.find("a hybrid Mamba model (--is-hybrid-model) is not written in Hugging Face's format yet"),
            std::string::npos)
      << hf.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "hf" / "config.json"));
  std::filesystem::remove_all(dir);
}

TEST(GalePretrainHybridMamba, RefusesWhatIsNotSupportedYet) {
  struct Case {
    std::vector<std::string> flags;
    const char* message;
  };
  const Case cases[] = {
      {{"--hybrid-attention-ratio", "0.5", "--hybrid-override-pattern", "MM"},
       "--hybrid-override-pattern: the number of each type of layer in the pattern ('MM') must match the number in "
       "the pattern the ratios give ('M*')"},
      {{"--hybrid-override-pattern", "MMM"}, "--hybrid-override-pattern: the pattern has the wrong length: expected 2"},
      {{"--hybrid-override-pattern", "MX"}, "--hybrid-override-pattern: 'X' is not a layer symbol"},
      {{"--mamba-head-dim", "48"}, "--mamba-head-dim: expected a divisor of the Mamba mixer's d_inner"},
      {{"--mamba-num-groups", "3"}, "--mamba-num-groups: expected a divisor of the Mamba mixer's heads"},
      {{"--recompute-norm"}, "--is-hybrid-model with --recompute-norm: not supported yet"},
      {{"--spec", "my.specs", "my_spec"}, "--spec: custom layer specs are not supported yet"},
      {{"--swap-attention"}, "--is-hybrid-model with --swap-attention: not supported yet"},
  };
  for (const Case& c : cases) {
    test::RunResult r = run(mamba(1, 2, c.flags));
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.message << "\n" << r.output;
  }
  // At TP 2 (two processes) with one group of B and C: refused before anything is built.
  test::RunResult tp = run(mamba(2, 2, {"--tensor-model-parallel-size", "2", "--mamba-num-groups", "1"}), 2);
  EXPECT_NE(tp.exit_code, 0) << tp.output;
  EXPECT_NE(tp.output.find("--mamba-num-groups: expected a multiple of --tensor-model-parallel-size (2"),
            std::string::npos)
      << tp.output;
  // The Mamba flags need the hybrid model.
  test::RunResult plain = run(testing::tiny_gpt_pretrain(1, 2, {"--mamba-state-dim", "16"}, {}));
  EXPECT_NE(plain.exit_code, 0) << plain.output;
  EXPECT_NE(plain.output.find("--mamba-state-dim needs --is-hybrid-model"), std::string::npos) << plain.output;
}

// Megatron main's --hybrid-layer-pattern: the same run as --hybrid-override-pattern (which now
// warns that it is deprecated), its length the layer count whatever --num-layers says (warned).
TEST(GalePretrainHybridMamba, LayerPatternSpelling) {
  test::RunResult old = run(mamba(1, 3, {"--num-layers", "4", "--hybrid-override-pattern", "M*-M"}));
  ASSERT_EQ(old.exit_code, 0) << old.output;
  EXPECT_NE(old.output.find("--hybrid-override-pattern is deprecated. Use --hybrid-layer-pattern instead."),
            std::string::npos)
      << old.output;
  test::RunResult now = run(mamba(1, 3, {"--hybrid-layer-pattern", "M*-M"}));
  ASSERT_EQ(now.exit_code, 0) << now.output;
  EXPECT_EQ(now.output.find("is deprecated"), std::string::npos) << now.output;
  EXPECT_NE(now.output.find("--hybrid-layer-pattern is set; ignoring --num-layers (2) and using the layer count "
                            "derived from the pattern (4)."),
            std::string::npos)
      << now.output;
  EXPECT_EQ(losses(now.output), losses(old.output));
  EXPECT_EQ(losses(now.output).size(), 3u);
}

}  // namespace
}  // namespace gale
