// `gale pretrain --experimental-attention-variant gdn`: a tiny model with Gated DeltaNet and full-attention
// layers learns on the mock data; the deprecated spelling gated_delta_net and the list form of
// --linear-attention-freq give the same run; two pipeline stages or two data-parallel ranks give one
// process's losses; save and resume continue the run exactly; full recomputation gives the same run and
// --bf16 a close one; tensor parallelism 2 (with and without sequence parallelism) gives one
// process's losses, saves Megatron's per-rank split of in_proj and resumes at TP 1; gale generate and
// evaluate load the checkpoint (GDN decoding states); refused
// combinations are errors naming the flags.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
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

// 4 layers: --linear-attention-freq 2 makes layers 0 and 2 Gated DeltaNet, 1 and 3 full attention.
std::vector<std::string> gdn_model(std::vector<std::string> extra, const char* iters = "8",
                                   const char* variant = "gdn") {
  std::vector<std::string> argv = {
      "pretrain", "--num-layers", "4", "--hidden-size", "48", "--num-attention-heads", "4", "--seq-length", "48",
      "--max-position-embeddings", "48", "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters",
      iters, "--lr", "1e-2", "--mock-data", "--vocab-size", "4096", "--log-interval", "1", "--eval-iters", "0",
      "--num-threads", "1", "--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope",
      "--disable-bias-linear", "--attention-dropout", "0.0", "--hidden-dropout", "0.0",
      "--experimental-attention-variant", variant, "--linear-num-key-heads", "2", "--linear-num-value-heads", "4",
      "--linear-key-head-dim", "8", "--linear-value-head-dim", "6", "--linear-conv-kernel-dim", "3"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

test::RunResult run(int np, std::vector<std::string> extra, const char* iters = "8", const char* variant = "gdn") {
  std::vector<std::string> argv = gdn_model(std::move(extra), iters, variant);
  argv.insert(argv.begin(), GALE_BINARY);
  argv = testing::launch_argv(np, argv, {});
  return test::run_with_timeout(argv, testing::kMpiEnv, 300);
}

TEST(GalePretrainGdn, MixedLayersLearnAndEverySpellingGivesTheSameRun) {
  // The mock data's losses are noisy at this size: the mean of the last six iterations against the first six's.
  const test::RunResult a = run(1, {"--linear-attention-freq", "2"}, "24");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const std::vector<double> lm = logged_values(a.output, "lm loss");
  ASSERT_EQ(lm.size(), 24u) << a.output;
  double first = 0.0, last = 0.0;
  for (size_t i = 0; i < 6; ++i) first += lm[i] / 6.0, last += lm[18 + i] / 6.0;
  EXPECT_LT(last, first - 0.15) << a.output;
  // Megatron's deprecated spelling (with its warning) and the same pattern as a list.
  const test::RunResult b = run(1, {"--linear-attention-freq", "([1]+[0])*2"}, "24", "gated_delta_net");
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_NE(b.output.find("gated_delta_net is deprecated"), std::string::npos) << b.output;
  EXPECT_EQ(logged_values(b.output, "lm loss"), lm);
  // Another pattern is another model: every layer GDN but the last.
  const test::RunResult c = run(1, {"--linear-attention-freq", "4"}, "4");
  ASSERT_EQ(c.exit_code, 0) << c.output;
  const std::vector<double> lc = logged_values(c.output, "lm loss");
  ASSERT_EQ(lc.size(), 4u);
  EXPECT_NE(lc[1], lm[1]);
}

TEST(GalePretrainGdn, TwoPipelineStagesOrDataParallelRanksGiveOneProcesssLosses) {
  const test::RunResult one = run(1, {"--linear-attention-freq", "2"}, "4");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const std::vector<double> a = logged_values(one.output, "lm loss");
  ASSERT_EQ(a.size(), 4u);
  for (const char* layout : {"--pipeline-model-parallel-size", "--data-parallel-size"}) {
    std::vector<std::string> flags = {"--linear-attention-freq", "2"};
    if (layout == std::string("--pipeline-model-parallel-size")) flags.insert(flags.end(), {layout, "2"});
    const test::RunResult two = run(2, flags, "4");  // without --pipeline-model-parallel-size: DP 2
    ASSERT_EQ(two.exit_code, 0) << two.output;
    const std::vector<double> b = logged_values(two.output, "lm loss");
    ASSERT_EQ(b.size(), 4u) << two.output;
    for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(b[i], a[i], 1e-5 * a[i]) << layout << ", iteration " << i + 1;
  }
}

// Full recomputation reruns a GDN layer's forward in backward: the same run; --bf16 within 1%.
TEST(GalePretrainGdn, RecomputationGivesTheSameLossesAndBf16IsClose) {
  const test::RunResult base = run(1, {"--linear-attention-freq", "2"}, "4");
  const test::RunResult full = run(1, {"--linear-attention-freq", "2", "--recompute-granularity", "full",
                                       "--recompute-method", "uniform", "--recompute-num-layers", "1"}, "4");
  const test::RunResult bf16 = run(1, {"--linear-attention-freq", "2", "--bf16"}, "4");
  ASSERT_EQ(base.exit_code, 0) << base.output;
  ASSERT_EQ(full.exit_code, 0) << full.output;
  ASSERT_EQ(bf16.exit_code, 0) << bf16.output;
  const std::vector<double> a = logged_values(base.output, "lm loss");
  ASSERT_EQ(a.size(), 4u);
  EXPECT_EQ(logged_values(full.output, "lm loss"), a);
  const std::vector<double> b = logged_values(bf16.output, "lm loss");
  ASSERT_EQ(b.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(b[i], a[i], 1e-2 * a[i]) << "iteration " << i + 1;
}

// The GDN parameters are saved and loaded with the model: a resumed run continues the same losses
// exactly.
TEST(GalePretrainGdn, SaveResumeContinuesTheRunExactly) {
  const std::string dir = "/tmp/gale_gdn_ckpt_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  const test::RunResult whole = run(1, {"--linear-attention-freq", "2"}, "4");
  const test::RunResult first =
      run(1, {"--linear-attention-freq", "2", "--save", dir, "--save-interval", "2", "--exit-interval", "2"}, "4");
  const test::RunResult resumed = run(1, {"--linear-attention-freq", "2", "--load", dir}, "4");
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  ASSERT_EQ(first.exit_code, 0) << first.output;
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const std::vector<double> a = logged_values(whole.output, "lm loss"), b = logged_values(resumed.output, "lm loss");
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 2u) << resumed.output;
  EXPECT_EQ(b[0], a[2]);
  EXPECT_EQ(b[1], a[3]);
  std::filesystem::remove_all(dir);
}

// `gale generate` and `gale evaluate` on a GDN checkpoint of `gale pretrain` (the model from its
// args): greedy texts alone equal those of static and dynamic batching (each request's GDN states
// in a slot), beam search and perplexity run; Hugging Face conversion without zero-centred norms is refused.
TEST(GalePretrainGdn, GenerateAndEvaluateLoadTheCheckpoint) {
  const std::string dir = "/tmp/gale_gdn_infer_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  const test::RunResult trained =
      run(1, {"--linear-attention-freq", "2", "--save", dir + "/ckpt", "--save-interval", "4"}, "4");
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  auto infer = [&](const char* sub, std::vector<std::string> extra) {
    return testing::infer_from_checkpoint(sub, dir + "/ckpt", std::move(extra));
  };
  // The texts: the output without the statistics lines.
  static const std::regex stats_line(R"(\[[^\]\n]*(tokens/s|decoding states)[^\]\n]*\]\n)");
  const std::vector<std::string> prompts = {"1 2 3", "17 5 9 9 30 12 7 100 4", "42", "8 8 8 8 8"};
  std::string alone, file;
  for (const std::string& p : prompts) {
    const test::RunResult r = infer("generate", {"--prompt", p, "--temperature", "0", "--max-new-tokens", "10"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string text = std::regex_replace(r.output, stats_line, "");
    EXPECT_EQ(text.rfind(p, 0), 0u) << "the prompt, then its continuation: " << r.output;
    EXPECT_GT(text.size(), p.size() + 10) << r.output;
    alone += text;
    file += p + "\n";
  }
  {
    std::ofstream out(dir + "/prompts.txt");
    out << file;
  }
  const test::RunResult st = testing::generate_batched(dir + "/ckpt", dir + "/prompts.txt", "10", {});
  ASSERT_EQ(st.exit_code, 0) << st.output;
  EXPECT_EQ(std::regex_replace(st.output, stats_line, ""), alone);
  // 2 requests' states of the 2 GDN layers: conv 2·(2·2·8 + 4·6) and the delta rule's 4·8·6 floats.
  EXPECT_NE(st.output.find("[Gated DeltaNet model: GDN decoding states " +
                           std::to_string(2 * 2 * (2 * (2 * 2 * 8 + 4 * 6) + 4 * 8 * 6) * 4) + " bytes]"),
            std::string::npos)
      << st.output;
  const test::RunResult dyn = testing::generate_batched(dir + "/ckpt", dir + "/prompts.txt", "10",
                                                       testing::small_dynamic_batching_flags("0.0035", "48"));
  ASSERT_EQ(dyn.exit_code, 0) << dyn.output;
  EXPECT_EQ(std::regex_replace(dyn.output, stats_line, ""), alone);
  const test::RunResult beam = infer("generate", {"--prompt", prompts[1], "--num-beams", "3", "--max-new-tokens", "6"});
  EXPECT_EQ(beam.exit_code, 0) << beam.output;
  {
    std::ofstream out(dir + "/docs.jsonl");
    out << "{\"text\": \"5 9 11 2 40 7 33 1 8 8 60 21\"}\n";
  }
  const test::RunResult ppl = infer("evaluate", {"--task", "ppl", "--task-data-path", dir + "/docs.jsonl"});
  ASSERT_EQ(ppl.exit_code, 0) << ppl.output;
  EXPECT_TRUE(std::regex_search(ppl.output, std::regex(R"(documents: 1 \| tokens: 12 \| lm loss: [0-9.E+-]+)")))
      << ppl.output;
  testing::expect_hf_conversion_refused(dir + "/ckpt", dir + "/hf",
                                        "a Gated DeltaNet model (--experimental-attention-variant gdn) is written as "
                                        "Qwen3NextForCausalLM only with zero-centred RMSNorm (--apply-layernorm-1p)");
  std::filesystem::remove_all(dir);
}

// LoRA on a GDN model (MindSpeed-LLM's flags; adapters on the GDN mixers' in_proj / out_proj, the
// attention layers' linear_qkv / linear_proj and every MLP: tests/model/gdn_lora_test.cc): a
// fine-tuning run from a base checkpoint trains and saves the adapters only; with the four
// six targets TP 2 (with and without SP) gives the one-process losses; gale generate / evaluate
// --lora-load merge them at load (a perplexity other than the base's, the same with the flags
// repeated); the GDN projections' adapters at CP 2 are refused in one line.
TEST(GalePretrainGdn, LoraFineTuningSavesAdaptersThatGenerateAndEvaluateMerge) {
  const std::string dir = "/tmp/gale_gdn_lora_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  const test::RunResult base =
      run(1, {"--linear-attention-freq", "2", "--save", dir + "/base", "--save-interval", "4"}, "4");
  ASSERT_EQ(base.exit_code, 0) << base.output;
  const std::vector<std::string> lora = {"--lora-r", "4", "--lora-alpha", "8", "--lora-target-modules", "linear_qkv",
                                         "linear_proj", "linear_fc1", "linear_fc2", "in_proj", "out_proj"};
  std::vector<std::string> tune = {"--linear-attention-freq", "2", "--load", dir + "/base", "--finetune", "--save",
                                   dir + "/lora", "--save-interval", "12"};
  tune.insert(tune.end(), lora.begin(), lora.end());
  const test::RunResult tuned = run(1, tune, "12");
  ASSERT_EQ(tuned.exit_code, 0) << tuned.output;
  const std::vector<double> lm = logged_values(tuned.output, "lm loss");
  ASSERT_EQ(lm.size(), 12u) << tuned.output;
  for (double l : lm) EXPECT_TRUE(std::isfinite(l)) << tuned.output;
  // All six targets at TP 2, with and without SP (the base resharded at load, the adapters split as
  // their linears: in_proj's lora_B per section, out_proj's lora_A by columns): one process's losses.
  std::vector<std::string> tune1(tune.begin(), tune.begin() + 5);  // the model, --load, --finetune
  tune1.insert(tune1.end(), lora.begin(), lora.end());
  std::vector<std::string> tune_tp = tune1;
  tune_tp.insert(tune_tp.end(), {"--tensor-model-parallel-size", "2", "--make-vocab-size-divisible-by", "64"});
  std::vector<std::string> tune_sp = tune_tp;
  tune_sp.insert(tune_sp.end(), {"--sequence-parallel", "--save", dir + "/lora_sp", "--save-interval", "6"});
  tune1.insert(tune1.end(), {"--save", dir + "/lora1", "--save-interval", "6"});
  const test::RunResult one = run(1, tune1, "6");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const std::vector<double> l1 = logged_values(one.output, "lm loss");
  ASSERT_EQ(l1.size(), 6u) << one.output;
  EXPECT_NE(l1[0], l1[5]);
  for (const auto& [what, flags] : {std::pair{"TP 2", tune_tp}, std::pair{"TP 2 + SP", tune_sp}}) {
    const test::RunResult tp = run(2, flags, "6");
    ASSERT_EQ(tp.exit_code, 0) << tp.output;
    const std::vector<double> lt = logged_values(tp.output, "lm loss");
    ASSERT_EQ(lt.size(), 6u) << tp.output;
    for (size_t i = 0; i < lt.size(); ++i) EXPECT_NEAR(lt[i], l1[i], 1e-5 * l1[i]) << what << ", iteration " << i + 1;
  }
  // The adapter checkpoint holds lora_A / lora_B only: no GDN tensor.
  const StatusOr<SafetensorsFile> shard = SafetensorsFile::open(dir + "/lora/iter_0000012/shard_00000.safetensors");
  ASSERT_TRUE(shard.ok()) << shard.status().to_string();
  EXPECT_TRUE(shard->contains("decoder.layers.0.mlp.linear_fc1.lora_A.default.weight"));
  EXPECT_TRUE(shard->contains("decoder.layers.1.self_attention.linear_qkv.lora_B.default.weight"));
  EXPECT_TRUE(shard->contains("decoder.layers.0.self_attention.in_proj.lora_A.default.weight"));
  EXPECT_TRUE(shard->contains("decoder.layers.2.self_attention.out_proj.lora_B.default.weight"));
  EXPECT_FALSE(shard->contains("decoder.layers.0.self_attention.in_proj.weight"));
  auto infer = [&](const char* sub, std::vector<std::string> extra) {
    return testing::infer_from_checkpoint(sub, dir + "/base", std::move(extra));
  };
  std::vector<std::string> with_lora = {"--lora-load", dir + "/lora"};
  with_lora.insert(with_lora.end(), lora.begin(), lora.end());
  auto plus = [](std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  const test::RunResult g =
      infer("generate", plus({"--prompt", "17 5 9 9 30", "--temperature", "0", "--max-new-tokens", "8"}, with_lora));
  ASSERT_EQ(g.exit_code, 0) << g.output;
  EXPECT_NE(g.output.find("[5 prompt tokens, 8 generated"), std::string::npos) << g.output;
  EXPECT_NE(g.output.find("\n17 5 9 9 30 "), std::string::npos) << g.output;
  {
    std::ofstream out(dir + "/docs.jsonl");
    out << "{\"text\": \"5 9 11 2 40 7 33 1 8 8 60 21\"}\n";
  }
  const std::vector<std::string> ppl = {"--task", "ppl", "--task-data-path", dir + "/docs.jsonl"};
  const std::regex loss(R"(\| lm loss: ([0-9.E+-]+) \|)");
  auto ppl_of = [&](const std::vector<std::string>& extra) {
    const test::RunResult e = infer("evaluate", plus(ppl, extra));
    EXPECT_EQ(e.exit_code, 0) << e.output;
    std::smatch m;
    EXPECT_TRUE(std::regex_search(e.output, m, loss)) << e.output;
    return m.empty() ? std::string() : m[1].str();
  };
  const std::string adapted = ppl_of(with_lora), again = ppl_of(with_lora), plain = ppl_of({});
  EXPECT_FALSE(adapted.empty());
  EXPECT_EQ(adapted, again);
  EXPECT_NE(adapted, plain) << "the merged adapters change the model";
  // The adapters saved at TP 2 + SP (in_proj's lora_B gathered per section) are the TP 1 run's: merged
  // into the base they give its perplexity.
  auto adapters = [&](const std::string& d) {
    std::vector<std::string> a = {"--lora-load", d};
    a.insert(a.end(), lora.begin(), lora.end());
    return std::stod(ppl_of(a));
  };
  const double from_one = adapters(dir + "/lora1"), from_sp = adapters(dir + "/lora_sp");
  EXPECT_NE(from_one, std::stod(plain));
  EXPECT_NEAR(from_sp, from_one, 1e-5 * from_one);
  // The GDN projections' adapters under TP: refused, naming the module.
  const test::RunResult in_proj = run(2, {"--linear-attention-freq", "2", "--lora-target-modules", "in_proj",
                                          "--context-parallel-size", "2"}, "1");
  EXPECT_NE(in_proj.exit_code, 0);
  EXPECT_NE(in_proj.output.find("--lora-target-modules in_proj with --context-parallel-size 2: not supported yet "
                                "(expected 1: the adapters of the Gated DeltaNet projections do not follow its "
                                "context-parallel all-to-alls)"),
            std::string::npos)
      << in_proj.output;
  std::filesystem::remove_all(dir);
}

// TP 2 splits every GDN layer by heads (one key head, two value heads per rank; the invariance of the
// gradients: tests/parallel/gdn_invariance_mpi_test.cc): one process's losses, the sums in another
// order. A checkpoint saved at TP 2 with SP holds each rank's share of in_proj's six sections as
// separate pieces and a TP 1 run resumes from it with one process's losses.
TEST(GalePretrainGdn, TensorParallelRunsGiveOneProcesssLossesAndResumeAtOneProcess) {
  const std::string dir = "/tmp/gale_gdn_tp_ckpt_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  const std::vector<std::string> model = {"--linear-attention-freq", "2"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), model.begin(), model.end());
    return extra;
  };
  const test::RunResult one = run(1, model, "4");
  // Megatron pads the vocabulary to a multiple of 128·TP: 64·2 keeps the one-process run's 4224 rows.
  const test::RunResult tp = run(2, with({"--tensor-model-parallel-size", "2", "--make-vocab-size-divisible-by", "64"}),
                                 "4");
  const test::RunResult sp = run(2, with({"--tensor-model-parallel-size", "2", "--make-vocab-size-divisible-by", "64",
                                          "--sequence-parallel", "--save", dir, "--save-interval", "2",
                                          "--exit-interval", "2"}), "4");
  const test::RunResult resumed = run(1, with({"--load", dir}), "4");
  for (const test::RunResult* r : {&one, &tp, &sp, &resumed}) ASSERT_EQ(r->exit_code, 0) << r->output;
  const std::vector<double> a = logged_values(one.output, "lm loss"), b = logged_values(tp.output, "lm loss"),
                            c = logged_values(sp.output, "lm loss"), d = logged_values(resumed.output, "lm loss");
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u) << tp.output;
  ASSERT_EQ(c.size(), 2u) << sp.output;
  ASSERT_EQ(d.size(), 2u) << resumed.output;
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(b[i], a[i], 1e-5 * a[i]) << "TP 2, iteration " << i + 1;
  for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(c[i], a[i], 1e-5 * a[i]) << "TP 2 with SP, iteration " << i + 1;
  for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(d[i], a[2 + i], 1e-5 * a[2 + i]) << "resumed at TP 1, iteration " << i + 3;
  // in_proj [q 16 | k 16 | v 24 | z 24 | b 4 | a 4] rows: TP rank 1 saves the second half of each section.
  const StatusOr<SafetensorsFile> shard = SafetensorsFile::open(dir + "/iter_0000002/shard_00001.safetensors");
  ASSERT_TRUE(shard.ok()) << shard.status().to_string();
  for (const char* row : {"8", "24", "44", "68", "82", "86"})
    EXPECT_TRUE(shard->contains(std::string("decoder.layers.0.self_attention.in_proj.weight@") + row + ",0")) << row;
  for (const char* row : {"8", "24", "44"})  // conv1d's q | k | v, dt_bias and A_log by value head
    EXPECT_TRUE(shard->contains(std::string("decoder.layers.0.self_attention.conv1d.weight@") + row + ",0")) << row;
  EXPECT_TRUE(shard->contains("decoder.layers.0.self_attention.A_log@2"));
  EXPECT_TRUE(shard->contains("decoder.layers.0.self_attention.out_proj.weight@0,12"));
  std::filesystem::remove_all(dir);
}

TEST(GalePretrainGdn, ContextParallelRunsReproduceTheirLayoutWithoutCp) {
  // GDN context parallelism (model/gdn_context_parallel.h): CP 2 against one process, TP 2 × CP 2
  // (with SP) against TP 2 (TP changes the initialisation, CP does not); 4 key and 8 value heads
  // so TP·CP = 4 divides them. Losses and grad norms as logged, 1e-5 relative.
  const std::vector<std::string> heads = {"--linear-attention-freq", "2", "--linear-num-key-heads", "4",
                                          "--linear-num-value-heads", "8"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), heads.begin(), heads.end());
    return extra;
  };
  const struct {
    int np_ref, np_cp;
    std::vector<std::string> ref, cp;
  } pairs[] = {
      {1, 2, {}, {"--context-parallel-size", "2"}},
      {2, 4, {"--tensor-model-parallel-size", "2", "--sequence-parallel"},
       {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--context-parallel-size", "2"}},
  };
  for (const auto& pr : pairs) {
    const test::RunResult a = run(pr.np_ref, with(pr.ref), "3");
    const test::RunResult b = run(pr.np_cp, with(pr.cp), "3");
    ASSERT_EQ(a.exit_code, 0) << a.output;
    ASSERT_EQ(b.exit_code, 0) << b.output;
    for (const char* key : {"lm loss", "grad norm"}) {
      const std::vector<double> x = logged_values(a.output, key), y = logged_values(b.output, key);
      ASSERT_EQ(x.size(), 3u) << a.output;
      ASSERT_EQ(y.size(), 3u) << b.output;
      for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], x[i], 1e-5 * std::abs(x[i])) << key << " " << i;
    }
  }
}

TEST(GalePretrainGdn, RefusalsAreErrorsNamingTheFlags) {
  struct Case {
    int np;  // the ranks the layout needs
    std::vector<std::string> flags;
    const char* variant;
    std::string expected;
  };
  const Case cases[] = {
      {1, {}, "gdn", "--experimental-attention-variant gdn needs --linear-attention-freq"},
      {2, {"--linear-attention-freq", "2", "--tensor-model-parallel-size", "2", "--linear-num-key-heads", "3",
           "--linear-num-value-heads", "6"}, "gdn",
       "--linear-num-key-heads: expected a multiple of --tensor-model-parallel-size (2: each rank holds 1/TP of the "
       "Gated DeltaNet heads), found 3"},
      {2, {"--linear-attention-freq", "2", "--context-parallel-size", "2", "--linear-num-key-heads", "3",
           "--linear-num-value-heads", "6"}, "gdn",
       "--linear-num-key-heads: expected a multiple of --tensor-model-parallel-size × --context-parallel-size "
       "(1 × 2 = 2: each rank holds 1/(TP·CP) of the Gated DeltaNet heads between the all-to-alls), found 3"},
      {4, {"--linear-attention-freq", "2", "--tensor-model-parallel-size", "2", "--context-parallel-size", "2"},
       "gdn",
       "--linear-num-key-heads: expected a multiple of --tensor-model-parallel-size × --context-parallel-size "
       "(2 × 2 = 4: each rank holds 1/(TP·CP) of the Gated DeltaNet heads between the all-to-alls), found 2"},
      {1, {}, "gdn2", "--experimental-attention-variant gdn2 needs --linear-attention-freq"},
      {1, {"--linear-attention-freq", "[1,0,1]"}, "gdn", "--linear-attention-freq: expected an integer >= 1 or a list of 4"},
      {1, {"--linear-attention-freq", "2", "--linear-num-value-heads", "3"}, "gdn",
       "--linear-num-value-heads: expected a multiple of --linear-num-key-heads (2), found 3"},
  };
  for (const Case& c : cases) {
    const test::RunResult r = run(c.np, c.flags, "2", c.variant);
    EXPECT_NE(r.exit_code, 0) << c.expected;
    EXPECT_NE(r.output.find(c.expected), std::string::npos) << r.output;
  }
  // Without the variant its flags are refused; without --swiglu the variant is.
  std::vector<std::string> plain = {GALE_BINARY, "pretrain", "--num-layers", "2", "--hidden-size", "48",
                                    "--num-attention-heads", "4", "--seq-length", "48", "--max-position-embeddings",
                                    "48", "--micro-batch-size", "2", "--train-iters", "1", "--mock-data",
                                    "--vocab-size", "4096", "--linear-attention-freq", "2"};
  const test::RunResult r = test::run_with_timeout(plain, {}, 120);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--linear-attention-freq needs --experimental-attention-variant gdn"), std::string::npos)
      << r.output;
  std::vector<std::string> no_swiglu = gdn_model({"--linear-attention-freq", "2"}, "1");
  no_swiglu.erase(std::find(no_swiglu.begin(), no_swiglu.end(), "--swiglu"));
  no_swiglu.insert(no_swiglu.begin(), GALE_BINARY);
  const test::RunResult s = test::run_with_timeout(no_swiglu, {}, 120);
  EXPECT_NE(s.exit_code, 0);
  EXPECT_NE(s.output.find("--experimental-attention-variant gdn needs --swiglu"), std::string::npos) << s.output;
}

}  // namespace
}  // namespace gale
