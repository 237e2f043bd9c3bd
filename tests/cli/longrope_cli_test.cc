// `gale pretrain / generate / convert` with --rope-scaling-type longrope: the same losses at levels 0 and 2
// (the fused RoPE kernel on LongRoPE's tables) and under TP 2 and CP 2 (load-balanced position shards, whose
// largest positions differ per rank, still pick the --seq-length table), other losses than plain RoPE, the
// flags recorded in checkpoints and restored by generate --use-checkpoint-args, and a converted Phi-3.5-style
// model generating across its original context as transformers does.
#include <gtest/gtest.h>

#include "ckpt/safetensors.h"
#include "ckpt/temp_dir.h"
#include "cli/log_line.h"
#include "cli/mpi_cli.h"
#include "subprocess.h"

namespace gale {
namespace {

using testing::kMpiEnv;
using testing::launch_argv;
using testing::regex_values;
using testing_util::TempDir;

// Head dim 64 / 4 = 16: 8 factors. --seq-length 32 > original 28: the long table in training; a CP 2 rank
// holding positions 8..23 alone would have picked the short one.
const std::vector<std::string> kLongRope = {
    "--rope-scaling-type", "longrope", "--rope-scaling-original-max-position-embeddings", "28", "--short-factor",
    "1.0,1.02,1.1,1.25,1.5,2.0,2.75,3.5", "--long-factor", "1.08,1.15,1.4,2.0,3.0,5.5,9.0,14.0"};

std::vector<std::string> tiny(int np, const std::vector<std::string>& extra) {
  std::vector<std::string> pretrain = {
      GALE_BINARY, "pretrain", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
      "--group-query-attention", "--num-query-groups", "2", "--swiglu", "--normalization", "RMSNorm",
      "--position-embedding-type", "rope", "--disable-bias-linear", "--seq-length", "32", "--max-position-embeddings",
      "64", "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", "3", "--lr", "3e-3",
      "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "4096", "--log-interval", "1",
      "--eval-iters", "0", "--num-threads", "1", "--attention-dropout", "0", "--hidden-dropout", "0"};
  return launch_argv(np, pretrain, extra);
}

std::vector<double> losses(int np, std::vector<std::string> flags) {
  test::RunResult r = test::run_with_timeout(tiny(np, flags), kMpiEnv, 300);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return regex_values(r.output, R"(\| lm loss: ([0-9.E+-]+) \|)");
}

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(LongRopeCli, TrainsTheSameAtEveryLevelAndNotAsPlainRope) {
  const std::vector<double> level0 = losses(1, with(kLongRope, {"--optimization-level", "0"}));
  const std::vector<double> level2 =
      losses(1, with(kLongRope, {"--optimization-level", "2", "--use-fused-rotary-pos-emb"}));
  const std::vector<double> rope = losses(1, {"--optimization-level", "0"});
  ASSERT_EQ(level0.size(), 3u);
  ASSERT_EQ(level2.size(), 3u);
  ASSERT_EQ(rope.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(level2[i], level0[i], 1e-5 * level0[i]) << "iteration " << i + 1;
  EXPECT_NE(level0[2], rope[2]);
}

TEST(LongRopeCli, TensorAndContextParallelTrainAsOneProcess) {
  const std::vector<std::string> flags = with(kLongRope, {"--optimization-level", "0"});
  const std::vector<double> one = losses(1, flags);
  ASSERT_EQ(one.size(), 3u);
  for (const std::vector<std::string>& layout :
       {std::vector<std::string>{"--tensor-model-parallel-size", "2", "--make-vocab-size-divisible-by", "64"},
        std::vector<std::string>{"--context-parallel-size", "2"}}) {  // TP 2: the same padded vocabulary (4224)
    const std::vector<double> two = losses(2, with(flags, layout));
    ASSERT_EQ(two.size(), 3u) << layout[0];
    for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(two[i], one[i], 1e-5 * one[i]) << layout[0] << " iteration " << i + 1;
  }
}

TEST(LongRopeCli, RecordedInCheckpointsAndRestoredForGenerate) {
  TempDir tmp;
  const std::string ckpt = tmp.file("ckpt");
  test::RunResult r = test::run_with_timeout(
      tiny(1, with(kLongRope, {"--train-iters", "2", "--save", ckpt, "--save-interval", "2"})), kMpiEnv, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<std::string> other = kLongRope;
  other[7] = "1.08,1.15,1.4,2.0,3.0,5.5,9.0,15.0";  // another long factor
  r = test::run_with_timeout(tiny(1, with(other, {"--train-iters", "4", "--load", ckpt})), kMpiEnv, 300);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("does not match this model"), std::string::npos) << r.output;
  const std::vector<std::string> generate = {GALE_BINARY, "generate", "--load", ckpt, "--tokenizer-type",
                                             "NullTokenizer", "--vocab-size", "4096", "--prompt",
                                             "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24",
                                             "--temperature", "0", "--max-new-tokens", "8"};
  test::RunResult restored = test::run_with_timeout(with(generate, {"--use-checkpoint-args"}), kMpiEnv, 300);
  ASSERT_EQ(restored.exit_code, 0) << restored.output;
  test::RunResult explicit_flags = test::run_with_timeout(
      with(with(generate, {"--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
                           "--group-query-attention", "--num-query-groups", "2", "--swiglu", "--normalization",
                           "RMSNorm", "--position-embedding-type", "rope", "--disable-bias-linear", "--seq-length",
                           "32", "--max-position-embeddings", "64"}),
           kLongRope),
      kMpiEnv, 300);
  ASSERT_EQ(explicit_flags.exit_code, 0) << explicit_flags.output;
  auto text = [](const std::string& out) { return out.substr(out.find('\n') + 1); };  // past the timing line
  EXPECT_EQ(text(restored.output), text(explicit_flags.output));
  EXPECT_NE(text(restored.output).find("1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 "),
            std::string::npos)
      << restored.output;
}

std::vector<int64_t> ints(const std::string& safetensors, const std::string& name) {
  auto f = SafetensorsFile::open(safetensors);
  EXPECT_TRUE(f.ok()) << f.status().message();
  Tensor t = f->read(name, DType::kI64).value();
  return std::vector<int64_t>(t.data<int64_t>(), t.data<int64_t>() + t.numel());
}

// The converted phi3_longrope fixture (original context 8) continues its 5-token prompt greedily with a KV
// cache as transformers does: short factors up to 8 tokens, long ones after, cached keys kept
// (tools/reference/hf_fixture_phi3_longrope.py); and its 12-token prompt as the recomputing reference.
TEST(LongRopeCli, ConvertedPhi35StyleModelGeneratesAsTransformers) {
  TempDir tmp;
  const std::string hf = std::string(GALE_TEST_DATA_DIR) + "/hf/phi3_longrope", out = tmp.file("gale");
  test::RunResult r = test::run_with_timeout({GALE_BINARY, "convert", "--load-model-type", "hf", "--save-model-type",
                                              "gale", "--load-dir", hf, "--save-dir", out},
                                             kMpiEnv, 120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string golden = hf + "/golden.safetensors";
  const std::vector<int64_t> tokens = ints(golden, "tokens");
  for (const auto& [prompt_length, key] : {std::pair{5, "cached_greedy"}, std::pair{12, "greedy"}}) {
    std::string prompt, expected;
    for (int i = 0; i < prompt_length; ++i) prompt += (i ? " " : "") + std::to_string(tokens[i]);
    expected = prompt;
    const std::vector<int64_t> greedy = ints(golden, key);
    for (int64_t t : greedy) expected += " " + std::to_string(t);
    r = test::run_with_timeout({GALE_BINARY, "generate", "--load", out, "--use-checkpoint-args", "--tokenizer-type",
                                "NullTokenizer", "--vocab-size", "99", "--prompt", prompt, "--max-new-tokens",
                                std::to_string(greedy.size()), "--temperature", "0"},
                               kMpiEnv, 120);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(expected + "\n"), std::string::npos) << key << ": expected " << expected << "\n" << r.output;
  }
}

}  // namespace
}  // namespace gale
