// `gale pretrain --experimental-attention-variant gdn2` (Gated DeltaNet-2): a tiny model with GDN2 and
// full-attention layers learns on the mock data; TP 2 with sequence parallelism gives one process's
// losses, saves Megatron's per-rank split of in_proj's seven sections (query, key, value, z, f, b, w),
// dt_bias by key channel and A_log by key head, and resumes at TP 1; gale generate and evaluate load
// the checkpoint (its args record gdn2; GDN decoding states); conversion is refused; refused
// combinations are errors naming the flags.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include "checkpoint_inference.h"
#include "ckpt/safetensors.h"
#include "cli/log_line.h"
#include "mpi_cli.h"
#include "subprocess.h"

namespace gale {
namespace {

using testing::logged_values;

// 4 layers: --linear-attention-freq 2 makes layers 0 and 2 Gated DeltaNet-2, 1 and 3 full attention.
std::vector<std::string> gdn2_model(std::vector<std::string> extra, const char* iters) {
  std::vector<std::string> argv = {
      GALE_BINARY, "pretrain", "--num-layers", "4", "--hidden-size", "48", "--num-attention-heads", "4",
      "--seq-length", "48", "--max-position-embeddings", "48", "--micro-batch-size", "2", "--global-batch-size", "4",
      "--train-iters", iters, "--lr", "1e-2", "--mock-data", "--vocab-size", "4096", "--log-interval", "1",
      "--eval-iters", "0", "--num-threads", "1", "--swiglu", "--normalization", "RMSNorm",
      "--position-embedding-type", "rope", "--disable-bias-linear", "--attention-dropout", "0.0", "--hidden-dropout",
      "0.0", "--experimental-attention-variant", "gdn2", "--linear-num-key-heads", "2", "--linear-num-value-heads", "4",
      "--linear-key-head-dim", "8", "--linear-value-head-dim", "6", "--linear-conv-kernel-dim", "3"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

test::RunResult run(int np, std::vector<std::string> extra, const char* iters) {
  return test::run_with_timeout(testing::launch_argv(np, gdn2_model(std::move(extra), iters), {}), testing::kMpiEnv,
                                300);
}

TEST(GalePretrainGdn2, LearnsAndTensorParallelRunsGiveOneProcesssLossesAndResumeAtOneProcess) {
  const test::RunResult learn = run(1, {"--linear-attention-freq", "2"}, "24");
  ASSERT_EQ(learn.exit_code, 0) << learn.output;
  const std::vector<double> lm = logged_values(learn.output, "lm loss");
  ASSERT_EQ(lm.size(), 24u) << learn.output;
  double first = 0.0, last = 0.0;
  for (size_t i = 0; i < 6; ++i) first += lm[i] / 6.0, last += lm[18 + i] / 6.0;
  EXPECT_LT(last, first - 0.15) << learn.output;

  // The 4-iteration run (its own learning-rate schedule) that TP 2 and the resumed run reproduce.
  const test::RunResult one = run(1, {"--linear-attention-freq", "2"}, "4");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const std::vector<double> a = logged_values(one.output, "lm loss");
  ASSERT_EQ(a.size(), 4u) << one.output;
  const std::string dir = "/tmp/gale_gdn2_tp_ckpt_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  // Megatron pads the vocabulary to a multiple of 128·TP: 64·2 keeps the one-process run's 4224 rows.
  const test::RunResult sp = run(2, {"--linear-attention-freq", "2", "--tensor-model-parallel-size", "2",
                                     "--make-vocab-size-divisible-by", "64", "--sequence-parallel", "--save", dir,
                                     "--save-interval", "2", "--exit-interval", "2"}, "4");
  const test::RunResult resumed = run(1, {"--linear-attention-freq", "2", "--load", dir}, "4");
  for (const test::RunResult* r : {&sp, &resumed}) ASSERT_EQ(r->exit_code, 0) << r->output;
  const std::vector<double> c = logged_values(sp.output, "lm loss"), d = logged_values(resumed.output, "lm loss");
  ASSERT_EQ(c.size(), 2u) << sp.output;
  ASSERT_EQ(d.size(), 2u) << resumed.output;
  for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(c[i], a[i], 1e-5 * a[i]) << "TP 2 with SP, iteration " << i + 1;
  for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(d[i], a[2 + i], 1e-5 * a[2 + i]) << "resumed at TP 1, iteration " << i + 3;
  // in_proj [q 16 | k 16 | v 24 | z 24 | f 16 | b 16 | w 24] rows: TP rank 1 saves the second half of each.
  const StatusOr<SafetensorsFile> shard = SafetensorsFile::open(dir + "/iter_0000002/shard_00001.safetensors");
  ASSERT_TRUE(shard.ok()) << shard.status().to_string();
  for (const char* row : {"8", "24", "44", "68", "88", "104", "124"})
    EXPECT_TRUE(shard->contains(std::string("decoder.layers.0.self_attention.in_proj.weight@") + row + ",0")) << row;
  EXPECT_TRUE(shard->contains("decoder.layers.0.self_attention.dt_bias@8"));  // key channels 8 … 15
  EXPECT_TRUE(shard->contains("decoder.layers.0.self_attention.A_log@1"));    // key head 1
  EXPECT_TRUE(shard->contains("decoder.layers.0.self_attention.out_proj.weight@0,12"));
  std::filesystem::remove_all(dir);
}

TEST(GalePretrainGdn2, GenerateAndEvaluateLoadTheCheckpoint) {
  const std::string dir = "/tmp/gale_gdn2_infer_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  const test::RunResult trained =
      run(1, {"--linear-attention-freq", "2", "--save", dir + "/ckpt", "--save-interval", "4"}, "4");
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const test::RunResult gen = testing::infer_from_checkpoint(
      "generate", dir + "/ckpt", {"--prompt", "17 5 9 9 30", "--temperature", "0", "--max-new-tokens", "8"});
  ASSERT_EQ(gen.exit_code, 0) << gen.output;
  EXPECT_NE(gen.output.find("17 5 9 9 30"), std::string::npos) << gen.output;
  {
    std::ofstream out(dir + "/docs.jsonl");
    out << "{\"text\": \"5 9 11 2 40 7 33 1 8 8 60 21\"}\n";
  }
  const test::RunResult ppl =
      testing::infer_from_checkpoint("evaluate", dir + "/ckpt", {"--task", "ppl", "--task-data-path", dir + "/docs.jsonl"});
  ASSERT_EQ(ppl.exit_code, 0) << ppl.output;
  EXPECT_TRUE(std::regex_search(ppl.output, std::regex(R"(documents: 1 \| tokens: 12 \| lm loss: [0-9.E+-]+)")))
      << ppl.output;
  testing::expect_hf_conversion_refused(dir + "/ckpt", dir + "/hf",
                                        "a Gated DeltaNet-2 model (args 'experimental_attention_variant' \"gdn2\"): "
                                        "conversion to or from Hugging Face's format is not supported yet (no "
                                        "Hugging Face architecture holds it; Megatron's torch format does)");
  std::filesystem::remove_all(dir);
}

TEST(GalePretrainGdn2, RefusalsAreErrorsNamingTheFlags) {
  struct Case {
    std::vector<std::string> flags;
    std::string expected;
  };
  const Case cases[] = {
      {{}, "--experimental-attention-variant gdn2 needs --linear-attention-freq"},
      {{"--linear-attention-freq", "2", "--lora-target-modules", "in_proj", "--lora-r", "4"},
       "--lora-target-modules in_proj with --experimental-attention-variant gdn2: not supported yet"},
      {{"--linear-attention-freq", "2", "--multi-latent-attention"},
       "--experimental-attention-variant gdn2 with --multi-latent-attention: not supported yet"},
      {{"--linear-attention-freq", "2", "--linear-num-value-heads", "3"},
       "--linear-num-value-heads: expected a multiple of --linear-num-key-heads (2), found 3"},
      // A hybrid model's 'G' layers take the variant, not --linear-attention-freq.
      {{"--is-hybrid-model", "--hybrid-override-pattern", "G*G*", "--linear-attention-freq", "2"},
       "--linear-attention-freq needs Gated DeltaNet layers ('G') in --hybrid-override-pattern"},
  };
  for (const Case& c : cases) {
    const test::RunResult r = run(1, c.flags, "1");
    EXPECT_NE(r.exit_code, 0) << c.expected;
    EXPECT_NE(r.output.find(c.expected), std::string::npos) << r.output;
  }
}

}  // namespace
}  // namespace gale
