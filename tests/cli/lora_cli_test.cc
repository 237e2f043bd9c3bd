// LoRA fine-tuning end to end: a base trained and saved by `gale pretrain`, then fine-tuned with
// --lora-r / --lora-alpha / --lora-target-modules on instruction data (the loss falls, the
// checkpoint holds only the adapters, --lora-load resumes exactly), merged by `gale convert
// --lora-load`, MoE adapters (routed experts under EP and expert TP, shared experts) reproducing the
// single-process run, and one-line flag errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <regex>

#include "ckpt/checkpoint_reader.h"
#include "ckpt/safetensors.h"
#include "cli/cli_test_util.h"
#include "cli/mpi_cli.h"
#include "data/data_test_util.h"
#include "subprocess.h"

namespace gale {
namespace {

const std::string kRef = std::string(GALE_TEST_DATA_DIR) + "/reference/sft";
const std::string kQwen = std::string(GALE_TEST_DATA_DIR) + "/tokenizers/qwen2_style";
const std::vector<std::string> kLora = {"--lora-r", "8", "--lora-alpha", "16", "--lora-target-modules",
                                        "linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"};

std::vector<std::string> sft(const std::string& prefix, int iters, std::vector<std::string> extra) {
  std::vector<std::string> argv = {
      GALE_BINARY, "pretrain", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
      "--seq-length", "128", "--max-position-embeddings", "128", "--micro-batch-size", "2", "--global-batch-size", "4",
      "--train-iters", std::to_string(iters), "--log-interval", "1", "--eval-interval", "1000", "--eval-iters", "0",
      "--attention-dropout", "0", "--hidden-dropout", "0", "--num-threads", "1", "--is-instruction-dataset",
      "--data-path", prefix, "--split", "100,0,0", "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
      kQwen};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

std::vector<std::string> plus(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::vector<std::string> loss_fields(const std::string& output) {
  std::vector<std::string> out;
  std::regex re(R"(\| lm loss: ([0-9.E+-]+) \|)");
  for (std::sregex_iterator it(output.begin(), output.end(), re), end; it != end; ++it) out.push_back((*it)[1]);
  return out;
}

class LoraCli : public ::testing::Test {
 protected:
  void SetUp() override {
    auto p = testing::run_gale("preprocess --handler-name AlpacaStyleInstructionHandler --input " + kRef +
                                   "/alpaca.jsonl --output-prefix " + dir_.file("sft") +
                                   " --tokenizer-type HuggingFaceTokenizer --tokenizer-model " + kQwen +
                                   " --prompt-type qwen --seq-length 128",
                               dir_.path());
    ASSERT_EQ(p.exit_code, 0) << p.err;
    test::RunResult r = test::run_with_timeout(
        sft(dir_.file("sft"), 6, {"--lr", "3e-3", "--save", dir_.file("base"), "--save-interval", "6"}), {}, 300);
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  std::vector<std::string> lora_run(int iters, std::vector<std::string> extra) {
    return sft(dir_.file("sft"), iters,
               plus(plus({"--lr", "1e-2", "--load", dir_.file("base"), "--finetune"}, kLora), extra));
  }
  // `gale evaluate --task ppl` of checkpoint `load` (then `extra`) on two short documents: the logged lm loss.
  double ppl(const std::string& load, const std::string& extra) {
    {
      std::ofstream docs(dir_.file("docs.jsonl"));
      docs << "{\"text\": \"Give three tips for staying healthy.\"}\n{\"text\": \"What is the capital of France?\"}\n";
    }
    auto e = testing::run_gale("evaluate --load " + load + " --use-checkpoint-args --tokenizer-type HuggingFaceTokenizer "
                               "--tokenizer-model " + kQwen + " --task ppl --task-data-path " + dir_.file("docs.jsonl") +
                               extra, dir_.path());
    EXPECT_EQ(e.exit_code, 0) << e.err << e.out;
    std::smatch m;
    EXPECT_TRUE(std::regex_search(e.out, m, std::regex(R"(\| lm loss: ([0-9.E+-]+) \|)"))) << e.out;
    return m.empty() ? 0.0 : std::stod(m[1]);
  }
  testing::TempDir dir_;
};

TEST_F(LoraCli, FineTunesTheAdaptersOnlyAndResumesExactly) {
  test::RunResult a = test::run_with_timeout(lora_run(24, {"--save", dir_.file("a"), "--save-interval", "12"}), {}, 300);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_NE(a.output.find("> LoRA: trainable parameters 16384 of 198400"), std::string::npos) << a.output;
  const std::vector<std::string> la = loss_fields(a.output);
  ASSERT_EQ(la.size(), 24u) << a.output;
  // Six documents, batches of four: single losses are noisy; the mean of the last six iterations
  // is clearly below that of the first six (about 5.67 -> 5.52).
  double first = 0.0, last = 0.0;
  for (int k = 0; k < 6; ++k) {
    first += std::stod(la[k]) / 6;
    last += std::stod(la[18 + k]) / 6;
  }
  EXPECT_LT(last, first - 0.08) << a.output;

  // The checkpoint holds the adapters (and their optimizer state) only.
  auto r = CheckpointReader::open(dir_.file("a"));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  int adapters = 0;
  for (const std::string& name : r.value().tensor_names()) {
    EXPECT_NE(name.find(".lora_"), std::string::npos) << name << " is not an adapter";
    adapters += name.rfind("optimizer.", 0) != 0;
  }
  EXPECT_EQ(adapters, 2 * 4 * 2);  // A and B of 4 linears in 2 layers

  // Stop at iteration 12, then resume from the adapters' checkpoint: the same losses 13..24.
  test::RunResult b = test::run_with_timeout(
      lora_run(24, {"--save", dir_.file("b"), "--save-interval", "12", "--exit-interval", "12"}), {}, 300);
  ASSERT_EQ(b.exit_code, 0) << b.output;
  test::RunResult c = test::run_with_timeout(
      lora_run(24, {"--lora-load", dir_.file("b"), "--save", dir_.file("b"), "--save-interval", "12"}), {}, 300);
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_NE(c.output.find("successfully loaded checkpoint from " + dir_.file("b") + " at iteration 12"),
            std::string::npos) << c.output;
  const std::vector<std::string> lc = loss_fields(c.output);
  ASSERT_EQ(lc.size(), 12u) << c.output;
  for (size_t k = 0; k < 12; ++k) EXPECT_EQ(lc[k], la[12 + k]) << "iteration " << 13 + k;

  // Merge into the base: convert to HF with and without the adapters; only the adapted weights differ.
  const std::string lora_flags = " --lora-load " + dir_.file("a") +
                                 " --lora-r 8 --lora-alpha 16 --lora-target-modules linear_qkv linear_proj linear_fc1 linear_fc2";
  auto plain = testing::run_gale("convert --load-model-type gale --save-model-type hf --load-dir " + dir_.file("base") +
                                     " --save-dir " + dir_.file("hf_base"),
                                 dir_.path());
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  auto merged = testing::run_gale("convert --load-model-type gale --save-model-type hf --load-dir " + dir_.file("base") +
                                      " --save-dir " + dir_.file("hf_merged") + lora_flags,
                                  dir_.path());
  ASSERT_EQ(merged.exit_code, 0) << merged.err;
  EXPECT_NE(merged.out.find("merging the LoRA adapters"), std::string::npos) << merged.out;
  auto f0 = SafetensorsFile::open(dir_.file("hf_base/model.safetensors"));
  auto f1 = SafetensorsFile::open(dir_.file("hf_merged/model.safetensors"));
  ASSERT_TRUE(f0.ok() && f1.ok());
  int differ = 0, same = 0;
  for (const SafetensorsEntry& e : f0.value().entries()) {
    Tensor t0 = f0.value().read(e.name, DType::kF32).value(), t1 = f1.value().read(e.name, DType::kF32).value();
    const bool equal = std::memcmp(t0.raw(), t1.raw(), t0.nbytes()) == 0;
    const bool adapted = e.name.find(".attn.") != std::string::npos || e.name.find(".mlp.") != std::string::npos;
    if (!adapted) {
      EXPECT_TRUE(equal) << e.name << " changed by the merge";
    }
    differ += !equal;
    same += equal;
  }
  EXPECT_GE(differ, 2 * 4) << "the merge changed too few tensors";
  EXPECT_GT(same, 0);

  // gale evaluate --lora-load (merged at load) gives the perplexity of the merged model converted
  // back from HF, and not that of the base.
  auto back = testing::run_gale("convert --load-model-type hf --save-model-type gale --load-dir " +
                                    dir_.file("hf_merged") + " --save-dir " + dir_.file("gale_merged"),
                                dir_.path());
  ASSERT_EQ(back.exit_code, 0) << back.err;
  // And merged straight into a Gale checkpoint (gale -> gale), MindSpeed-LLM's mg -> mg merge.
  auto gale_gale = testing::run_gale("convert --load-model-type gale --save-model-type gale --load-dir " +
                                         dir_.file("base") + " --save-dir " + dir_.file("gale_direct") + lora_flags,
                                     dir_.path());
  ASSERT_EQ(gale_gale.exit_code, 0) << gale_gale.err;
  EXPECT_NE(gale_gale.out.find("(8 merged)"), std::string::npos) << gale_gale.out;
  const double with_adapters = ppl(dir_.file("base"), lora_flags), merged_back = ppl(dir_.file("gale_merged"), "");
  const double merged_direct = ppl(dir_.file("gale_direct"), "");
  const double base_only = ppl(dir_.file("base"), "");
  EXPECT_NEAR(with_adapters, merged_back, 1e-5 * merged_back);
  EXPECT_NEAR(with_adapters, merged_direct, 1e-6 * merged_direct);
  EXPECT_GT(std::fabs(with_adapters - base_only), 1e-3);

  // A mismatched rank is a one-line error naming the flag.
  auto wrong = testing::run_gale("convert --load-model-type gale --save-model-type hf --load-dir " + dir_.file("base") +
                                     " --save-dir " + dir_.file("hf_wrong") + " --lora-load " + dir_.file("a") +
                                     " --lora-r 4 --lora-alpha 16 --lora-target-modules linear_qkv linear_proj "
                                     "linear_fc1 linear_fc2",
                                 dir_.path());
  EXPECT_NE(wrong.exit_code, 0);
  EXPECT_NE(wrong.err.find("--lora-r 4 does not match the adapters"), std::string::npos) << wrong.err;
}

// MindSpeed-LLM's usual flow: the base converted to Megatron's format, then LoRA-finetuned with
// --load naming it. The Megatron checkpoint (torch format, saved at PP 1 and at PP 2) gives the
// frozen base: the same losses, bit for bit, as the run on the Gale base it was converted from.
// (At TP 1: a checkpoint saved at TP 2 pads the vocabulary for TP 2, Megatron's rule, and loads at
// TP 2; PP 2 splits it into two stage files.)
TEST_F(LoraCli, OnAMegatronBaseAsOnTheGaleBase) {
  for (const char* pp : {"1", "2"}) {
    auto mg = testing::run_gale("convert --load-model-type gale --save-model-type mg --load-dir " + dir_.file("base") +
                                    " --save-dir " + dir_.file(std::string("mg") + pp) +
                                    " --target-pipeline-parallel-size " + pp,
                                dir_.path());
    ASSERT_EQ(mg.exit_code, 0) << mg.out << mg.err;
  }
  test::RunResult g = test::run_with_timeout(lora_run(4, {}), {}, 300);
  ASSERT_EQ(g.exit_code, 0) << g.output;
  const std::vector<std::string> lg = loss_fields(g.output);
  ASSERT_EQ(lg.size(), 4u) << g.output;
  for (const char* pp : {"1", "2"}) {
    std::vector<std::string> argv = lora_run(4, {});
    for (size_t i = 0; i + 1 < argv.size(); ++i)
      if (argv[i] == "--load") argv[i + 1] = dir_.file(std::string("mg") + pp);
    test::RunResult m = test::run_with_timeout(argv, {}, 300);
    ASSERT_EQ(m.exit_code, 0) << m.output;
    EXPECT_NE(m.output.find("reading Megatron's torch checkpoint"), std::string::npos) << m.output;
    EXPECT_EQ(loss_fields(m.output), lg) << "saved at PP " << pp << "\n" << m.output;
  }
}

// --lora-modules-to-save (peft's modules_to_save): the tied embedding and the final norm train
// whole beside the adapters, are saved with them (their optimizer state too), resume exactly
// and replace the base's tensors when merged.
TEST_F(LoraCli, ModulesToSaveTrainSaveResumeAndMerge) {
  const std::vector<std::string> save = {"--lora-modules-to-save", "word_embeddings", "final_layernorm"};
  test::RunResult a = test::run_with_timeout(lora_run(8, plus(save, {"--save", dir_.file("a"), "--save-interval", "8"})),
                                             {}, 300);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  // 16384 adapter elements + the embedding's and the final norm's (GPT: weight and bias of 64).
  std::smatch m;
  ASSERT_TRUE(std::regex_search(a.output, m, std::regex(R"(> LoRA: trainable parameters ([0-9]+) of 198400)")))
      << a.output;
  EXPECT_GT(std::stoll(m[1]), 16384 + 128) << a.output;
  // The modules to save start from the base (--load reads them): the first loss is the plain
  // LoRA run's (B = 0, so both are the base model's).
  test::RunResult plain = test::run_with_timeout(lora_run(1, {}), {}, 300);
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  ASSERT_FALSE(loss_fields(plain.output).empty()) << plain.output;
  EXPECT_EQ(loss_fields(plain.output)[0], loss_fields(a.output).at(0));
  auto r = CheckpointReader::open(dir_.file("a"));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  int adapters = 0, modules = 0, module_states = 0;
  for (const std::string& name : r.value().tensor_names()) {
    const bool opt = name.rfind("optimizer.", 0) == 0;
    if (name.find(".lora_") != std::string::npos) {
      adapters += !opt;
    } else if (name.find("word_embeddings") != std::string::npos || name.find("final_layernorm") != std::string::npos) {
      (opt ? module_states : modules) += 1;
    } else {
      ADD_FAILURE() << name << " is neither an adapter nor a module to save";
    }
  }
  EXPECT_EQ(adapters, 2 * 4 * 2);
  EXPECT_EQ(modules, 3);  // word_embeddings.weight, final_layernorm.weight and .bias
  EXPECT_GT(module_states, 0);
  // The embedding trained: it differs from the base's.
  auto base = CheckpointReader::open(dir_.file("base"));
  ASSERT_TRUE(base.ok());
  const std::string emb = "embedding.word_embeddings.weight";
  const Shape shape = base.value().global_shape(emb).value();
  Tensor e0 = base.value().read(emb, shape, DType::kF32).value(), e1 = r.value().read(emb, shape, DType::kF32).value();
  EXPECT_NE(0, std::memcmp(e0.raw(), e1.raw(), e0.nbytes())) << "the embedding did not train";

  // Stopped at 4 and resumed from the adapters' checkpoint: the same losses 5..8.
  test::RunResult b = test::run_with_timeout(
      lora_run(8, plus(save, {"--save", dir_.file("b"), "--save-interval", "4", "--exit-interval", "4"})), {}, 300);
  ASSERT_EQ(b.exit_code, 0) << b.output;
  test::RunResult c = test::run_with_timeout(lora_run(8, plus(save, {"--lora-load", dir_.file("b")})), {}, 300);
  ASSERT_EQ(c.exit_code, 0) << c.output;
  const std::vector<std::string> la = loss_fields(a.output), lc = loss_fields(c.output);
  ASSERT_EQ(la.size(), 8u);
  ASSERT_EQ(lc.size(), 4u) << c.output;
  for (size_t k = 0; k < 4; ++k) EXPECT_EQ(lc[k], la[4 + k]) << "iteration " << 5 + k;
  // Resuming with other modules to save would train other parameters: refused.
  test::RunResult d = test::run_with_timeout(
      lora_run(8, {"--lora-load", dir_.file("b"), "--lora-modules-to-save", "final_layernorm"}), {}, 300);
  EXPECT_NE(d.exit_code, 0);
  EXPECT_NE(d.output.find("--lora-modules-to-save [\"final_layernorm\"] does not match the modules saved in "
                          "--lora-load " + dir_.file("b") + " ([\"word_embeddings\",\"final_layernorm\"])"),
            std::string::npos) << d.output;

  // Merged (gale -> gale): the saved modules replace the base's, the adapters add B·A; evaluating
  // the merged checkpoint equals evaluating the base with --lora-load.
  const std::string lora_flags = " --lora-load " + dir_.file("a") +
                                 " --lora-r 8 --lora-alpha 16 --lora-target-modules linear_qkv linear_proj linear_fc1 "
                                 "linear_fc2";
  auto merged = testing::run_gale("convert --load-model-type gale --save-model-type gale --load-dir " +
                                      dir_.file("base") + " --save-dir " + dir_.file("merged") + lora_flags,
                                  dir_.path());
  ASSERT_EQ(merged.exit_code, 0) << merged.err;
  EXPECT_NE(merged.out.find("(11 merged)"), std::string::npos) << merged.out;  // 8 linears, 3 saved tensors
  auto mr = CheckpointReader::open(dir_.file("merged"));
  ASSERT_TRUE(mr.ok());
  Tensor e2 = mr.value().read(emb, shape, DType::kF32).value();
  EXPECT_EQ(0, std::memcmp(e1.raw(), e2.raw(), e1.nbytes())) << "the merged embedding is not the trained one";
  const double with_adapters = ppl(dir_.file("base"), lora_flags), merged_direct = ppl(dir_.file("merged"), "");
  EXPECT_NEAR(with_adapters, merged_direct, 1e-6 * merged_direct);
  // The flag, when given to a merge, must agree with the checkpoint's record.
  auto wrong = testing::run_gale("convert --load-model-type gale --save-model-type gale --load-dir " +
                                     dir_.file("base") + " --save-dir " + dir_.file("merged2") + lora_flags +
                                     " --lora-modules-to-save final_layernorm",
                                 dir_.path());
  EXPECT_NE(wrong.exit_code, 0);
  EXPECT_NE(wrong.err.find("--lora-modules-to-save does not match the modules saved in"), std::string::npos)
      << wrong.err;
}

// A MoE model (4 experts, top-2): the routed experts' adapters are saved by global expert, resume
// exactly, and merge into each expert (evaluating the merged checkpoint equals --lora-load).
TEST_F(LoraCli, MoeExpertAdaptersSaveResumeAndMerge) {
  const std::vector<std::string> moe = {"--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "32"};
  test::RunResult base = test::run_with_timeout(
      sft(dir_.file("sft"), 4, plus(moe, {"--lr", "3e-3", "--save", dir_.file("moe_base"), "--save-interval", "4"})),
      {}, 300);
  ASSERT_EQ(base.exit_code, 0) << base.output;
  auto run = [&](int iters, std::vector<std::string> extra) {
    return sft(dir_.file("sft"), iters,
               plus(plus(plus({"--lr", "1e-2", "--load", dir_.file("moe_base")}, moe), kLora), extra));
  };
  test::RunResult a = test::run_with_timeout(run(8, {"--save", dir_.file("ma"), "--save-interval", "8"}), {}, 300);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  auto r = CheckpointReader::open(dir_.file("ma"));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  int expert_adapters = 0;
  for (const std::string& name : r.value().tensor_names()) {
    if (name.rfind("optimizer.", 0) == 0) continue;
    EXPECT_NE(name.find(".lora_"), std::string::npos) << name;
    expert_adapters += name.find(".mlp.experts.local_experts.") != std::string::npos;
  }
  EXPECT_EQ(expert_adapters, 2 * 4 * 2 * 2);  // A and B of fc1 and fc2 of 4 experts in 2 layers
  EXPECT_TRUE(r.value().has_tensor("decoder.layers.1.mlp.experts.local_experts.3.linear_fc2.lora_B.default.weight"));

  test::RunResult b = test::run_with_timeout(
      run(8, {"--save", dir_.file("mb"), "--save-interval", "4", "--exit-interval", "4"}), {}, 300);
  ASSERT_EQ(b.exit_code, 0) << b.output;
  test::RunResult c = test::run_with_timeout(run(8, {"--lora-load", dir_.file("mb")}), {}, 300);
  ASSERT_EQ(c.exit_code, 0) << c.output;
  const std::vector<std::string> la = loss_fields(a.output), lc = loss_fields(c.output);
  ASSERT_EQ(la.size(), 8u) << a.output;
  ASSERT_EQ(lc.size(), 4u) << c.output;
  for (size_t k = 0; k < 4; ++k) EXPECT_EQ(lc[k], la[4 + k]) << "iteration " << 5 + k;

  // Saved at EP 2 (each rank its two experts' adapters, under their global indices), resumed at
  // EP 1: the same losses as the single-process run (up to the summation order).
  std::vector<std::string> ep2 = testing::mpirun_argv(2);
  const std::vector<std::string> stop =
      run(8, {"--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall", "--save",
              dir_.file("mb2"), "--save-interval", "4", "--exit-interval", "4"});
  ep2.insert(ep2.end(), stop.begin(), stop.end());
  test::RunResult b2 = test::run_with_timeout(ep2, testing::kMpiEnv, 300);
  ASSERT_EQ(b2.exit_code, 0) << b2.output;
  test::RunResult c2 = test::run_with_timeout(run(8, {"--lora-load", dir_.file("mb2")}), {}, 300);
  ASSERT_EQ(c2.exit_code, 0) << c2.output;
  const std::vector<std::string> lb2 = loss_fields(b2.output), lc2 = loss_fields(c2.output);
  ASSERT_EQ(lb2.size(), 4u) << b2.output;
  ASSERT_EQ(lc2.size(), 4u) << c2.output;
  for (size_t k = 0; k < 4; ++k) {
    EXPECT_NEAR(std::stod(lb2[k]), std::stod(la[k]), 1e-5 * std::stod(la[k])) << "EP 2, iteration " << k + 1;
    EXPECT_NEAR(std::stod(lc2[k]), std::stod(la[4 + k]), 1e-5 * std::stod(la[4 + k])) << "EP 1, iteration " << 5 + k;
  }

  const std::string lora_flags = " --lora-load " + dir_.file("ma") +
                                 " --lora-r 8 --lora-alpha 16 --lora-target-modules linear_qkv linear_proj linear_fc1 "
                                 "linear_fc2";
  auto merged = testing::run_gale("convert --load-model-type gale --save-model-type gale --load-dir " +
                                      dir_.file("moe_base") + " --save-dir " + dir_.file("moe_merged") + lora_flags,
                                  dir_.path());
  ASSERT_EQ(merged.exit_code, 0) << merged.err;
  EXPECT_NE(merged.out.find("(20 merged)"), std::string::npos) << merged.out;  // 2 x (qkv, proj, 4 x fc1, 4 x fc2)
  const double with_adapters = ppl(dir_.file("moe_base"), lora_flags), merged_direct = ppl(dir_.file("moe_merged"), "");
  const double base_only = ppl(dir_.file("moe_base"), "");
  EXPECT_NEAR(with_adapters, merged_direct, 1e-6 * merged_direct);
  EXPECT_GT(std::fabs(with_adapters - base_only), 1e-4);
}

// The routed experts' adapters under expert TP (the default ETP = TP 2: lora_B of fc1 and lora_A of
// fc2 split as the experts) and the shared experts' (split over TP as the dense MLP's): TP 2 + SP,
// EP 2 x ETP 2 (4 ranks) and DP 2 reproduce the single-process losses; the split adapters save under
// their global names (an EP 2 x ETP 2 checkpoint resumes at one process), a TP 2 run resumes exactly,
// and gale convert merges the shared experts' adapters too.
TEST_F(LoraCli, MoeAdaptersUnderExpertTensorParallelismAndOnSharedExperts) {
  const std::vector<std::string> moe = {"--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "32",
                                        "--moe-shared-expert-intermediate-size", "32", "--disable-bias-linear", "--swiglu",
                                        "--make-vocab-size-divisible-by", "64"};  // the same padded vocab at TP 1 and 2
  test::RunResult base = test::run_with_timeout(
      sft(dir_.file("sft"), 4, plus(moe, {"--lr", "3e-3", "--save", dir_.file("sbase"), "--save-interval", "4"})),
      {}, 300);
  ASSERT_EQ(base.exit_code, 0) << base.output;
  auto run = [&](int iters, std::vector<std::string> extra) {
    return sft(dir_.file("sft"), iters,
               plus(plus(plus({"--lr", "1e-2", "--load", dir_.file("sbase")}, moe), kLora), extra));
  };
  auto mpi = [&](int np, const std::vector<std::string>& argv) {
    std::vector<std::string> full = testing::mpirun_argv(np);
    full.insert(full.end(), argv.begin(), argv.end());
    return test::run_with_timeout(full, testing::kMpiEnv, 600);
  };
  test::RunResult one = test::run_with_timeout(run(8, {"--save", dir_.file("s1"), "--save-interval", "8"}), {}, 300);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const std::vector<std::string> la = loss_fields(one.output);
  ASSERT_EQ(la.size(), 8u) << one.output;
  auto expect_losses = [&](const std::vector<std::string>& got, size_t first, const char* what) {
    for (size_t k = 0; k < got.size(); ++k)
      EXPECT_NEAR(std::stod(got[k]), std::stod(la[first + k]), 1e-5 * std::stod(la[first + k]))
          << what << ", iteration " << first + k + 1;
  };

  const std::vector<std::string> tp2 = {"--tensor-model-parallel-size", "2", "--sequence-parallel"};
  test::RunResult t = mpi(2, run(8, tp2));
  ASSERT_EQ(t.exit_code, 0) << t.output;
  const std::vector<std::string> lt = loss_fields(t.output);
  ASSERT_EQ(lt.size(), 8u) << t.output;
  expect_losses(lt, 0, "TP 2 (ETP 2)");
  // TP 2 stopped at iteration 4 and resumed at TP 2: the same losses to the printed digit.
  test::RunResult ts = mpi(2, run(8, plus(tp2, {"--save", dir_.file("st"), "--save-interval", "4", "--exit-interval", "4"})));
  ASSERT_EQ(ts.exit_code, 0) << ts.output;
  test::RunResult tr = mpi(2, run(8, plus(tp2, {"--lora-load", dir_.file("st")})));
  ASSERT_EQ(tr.exit_code, 0) << tr.output;
  const std::vector<std::string> ltr = loss_fields(tr.output);
  ASSERT_EQ(ltr.size(), 4u) << tr.output;
  for (size_t k = 0; k < 4; ++k) EXPECT_EQ(ltr[k], lt[4 + k]) << "TP 2 resumed, iteration " << 5 + k;

  // EP 2 x ETP 2 on 4 ranks (expert-DP 1, DP 2), stopped at 4, resumed at one process.
  test::RunResult e = mpi(4, run(8, plus(tp2, {"--expert-model-parallel-size", "2", "--moe-token-dispatcher-type",
                                               "alltoall", "--save", dir_.file("se"), "--save-interval", "4",
                                               "--exit-interval", "4"})));
  ASSERT_EQ(e.exit_code, 0) << e.output;
  const std::vector<std::string> le = loss_fields(e.output);
  ASSERT_EQ(le.size(), 4u) << e.output;
  expect_losses(le, 0, "EP 2 x ETP 2");
  test::RunResult er = test::run_with_timeout(run(8, {"--lora-load", dir_.file("se")}), {}, 300);
  ASSERT_EQ(er.exit_code, 0) << er.output;
  const std::vector<std::string> ler = loss_fields(er.output);
  ASSERT_EQ(ler.size(), 4u) << er.output;
  expect_losses(ler, 4, "EP 2 x ETP 2 checkpoint resumed at one process");

  test::RunResult d = mpi(2, run(8, {"--exit-interval", "4"}));  // DP 2: one micro-batch per rank
  ASSERT_EQ(d.exit_code, 0) << d.output;
  const std::vector<std::string> ld = loss_fields(d.output);
  ASSERT_EQ(ld.size(), 4u) << d.output;
  expect_losses(ld, 0, "DP 2");

  auto r = CheckpointReader::open(dir_.file("s1"));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(r.value().has_tensor("decoder.layers.1.mlp.shared_experts.linear_fc1.lora_B.default.weight"));
  EXPECT_TRUE(r.value().has_tensor("decoder.layers.0.mlp.shared_experts.linear_fc2.lora_A.default.weight"));
  const std::string lora_flags = " --lora-load " + dir_.file("s1") +
                                 " --lora-r 8 --lora-alpha 16 --lora-target-modules linear_qkv linear_proj linear_fc1 "
                                 "linear_fc2";
  auto merged = testing::run_gale("convert --load-model-type gale --save-model-type gale --load-dir " +
                                      dir_.file("sbase") + " --save-dir " + dir_.file("smerged") + lora_flags,
                                  dir_.path());
  ASSERT_EQ(merged.exit_code, 0) << merged.err;
  // 2 x (qkv, proj, 4 x fc1, 4 x fc2, shared fc1, shared fc2)
  EXPECT_NE(merged.out.find("(24 merged)"), std::string::npos) << merged.out;
  const double with_adapters = ppl(dir_.file("sbase"), lora_flags), merged_direct = ppl(dir_.file("smerged"), "");
  EXPECT_NEAR(with_adapters, merged_direct, 1e-6 * merged_direct);
  EXPECT_GT(std::fabs(with_adapters - ppl(dir_.file("sbase"), "")), 1e-4);
}

// The experts' adapters with --moe-zero-memory (level0: the experts' input rows re-dispatched for
// backward; level1: fc1 and its adapter rerun, and the shared expert) give the same bits as keeping
// everything, also at EP 2; with --moe-tp-extend-ep (TP 2 ranks hold different whole experts and
// their adapters) the single-process losses, and its checkpoint resumes at one process.
TEST_F(LoraCli, MoeAdaptersWithZeroMemoryAndTpExtendEp) {
  const std::vector<std::string> moe = {"--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "32",
                                        "--moe-shared-expert-intermediate-size", "32", "--disable-bias-linear", "--swiglu",
                                        "--make-vocab-size-divisible-by", "64", "--moe-token-dispatcher-type",
                                        "alltoall", "--moe-permutation-async-comm", "--moe-grouped-gemm"};
  test::RunResult base = test::run_with_timeout(
      sft(dir_.file("sft"), 4, plus(moe, {"--lr", "3e-3", "--save", dir_.file("zbase"), "--save-interval", "4"})),
      {}, 300);
  ASSERT_EQ(base.exit_code, 0) << base.output;
  auto run = [&](int iters, std::vector<std::string> extra) {
    return sft(dir_.file("sft"), iters,
               plus(plus(plus({"--lr", "1e-2", "--load", dir_.file("zbase")}, moe), kLora), extra));
  };
  auto mpi = [&](int np, const std::vector<std::string>& argv) {
    std::vector<std::string> full = testing::mpirun_argv(np);
    full.insert(full.end(), argv.begin(), argv.end());
    return test::run_with_timeout(full, testing::kMpiEnv, 600);
  };
  const std::vector<std::string> overlap = {"--moe-alltoall-overlap-comm"};
  test::RunResult ref = test::run_with_timeout(run(6, overlap), {}, 300);
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  const std::vector<std::string> lr = loss_fields(ref.output);
  ASSERT_EQ(lr.size(), 6u) << ref.output;
  for (const char* level : {"level0", "level1"}) {
    test::RunResult z = test::run_with_timeout(run(6, plus(overlap, {"--moe-zero-memory", level})), {}, 300);
    ASSERT_EQ(z.exit_code, 0) << z.output;
    EXPECT_EQ(loss_fields(z.output), lr) << "--moe-zero-memory " << level;
  }
  test::RunResult ep = mpi(2, run(6, plus(overlap, {"--moe-zero-memory", "level1", "--expert-model-parallel-size", "2"})));
  ASSERT_EQ(ep.exit_code, 0) << ep.output;
  const std::vector<std::string> le = loss_fields(ep.output);
  ASSERT_EQ(le.size(), 6u) << ep.output;
  for (size_t k = 0; k < 6; ++k)
    EXPECT_NEAR(std::stod(le[k]), std::stod(lr[k]), 1e-5 * std::stod(lr[k])) << "zero memory at EP 2, iteration " << k + 1;

  test::RunResult x = mpi(2, run(6, {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--moe-tp-extend-ep",
                                     "--save", dir_.file("zx"), "--save-interval", "3", "--exit-interval", "3"}));
  ASSERT_EQ(x.exit_code, 0) << x.output;
  test::RunResult xr = test::run_with_timeout(run(6, {"--lora-load", dir_.file("zx")}), {}, 300);
  ASSERT_EQ(xr.exit_code, 0) << xr.output;
  const std::vector<std::string> lx = loss_fields(x.output), lxr = loss_fields(xr.output);
  ASSERT_EQ(lx.size(), 3u) << x.output;
  ASSERT_EQ(lxr.size(), 3u) << xr.output;
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_NEAR(std::stod(lx[k]), std::stod(lr[k]), 1e-5 * std::stod(lr[k])) << "--moe-tp-extend-ep, iteration " << k + 1;
    EXPECT_NEAR(std::stod(lxr[k]), std::stod(lr[3 + k]), 1e-5 * std::stod(lr[3 + k]))
        << "--moe-tp-extend-ep checkpoint resumed at one process, iteration " << 4 + k;
  }
}

TEST_F(LoraCli, FlagErrorsAreOneLine) {
  struct Case {
    std::vector<std::string> extra;
    const char* fragment;
  } cases[] = {
      {{"--lora-target-modules", "q_proj"}, "--lora-target-modules: expected linear_qkv, linear_proj, linear_fc1 or linear_fc2, found q_proj"},
      {{"--lora-r", "-1", "--lora-target-modules", "linear_qkv"}, "--lora-r: expected a positive integer, found -1"},
      {{"--lora-load", "/nonexistent"}, "--lora-load needs --lora-target-modules"},
      {{"--lora-modules-to-save", "lm_head", "--lora-target-modules", "linear_qkv"},
       "--lora-modules-to-save: expected word_embeddings, output_layer or final_layernorm, found lm_head"},
  };
  for (const Case& c : cases) {
    test::RunResult r = test::run_with_timeout(sft(dir_.file("sft"), 2, plus({"--lr", "1e-3"}, c.extra)), {}, 120);
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(c.fragment), std::string::npos) << r.output;
  }
}

}  // namespace
}  // namespace gale
