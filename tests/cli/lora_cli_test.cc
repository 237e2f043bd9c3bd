// LoRA fine-tuning end to end: a base trained and saved by `gale pretrain`, then fine-tuned with
// --lora-r / --lora-alpha / --lora-target-modules on instruction data (the loss falls, the
// checkpoint holds only the adapters, --lora-load resumes exactly), merged by `gale convert
// --lora-load`, and one-line flag errors.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <regex>

#include "ckpt/checkpoint_reader.h"
#include "ckpt/safetensors.h"
#include "cli/cli_test_util.h"
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
  {
    std::ofstream docs(dir_.file("docs.jsonl"));
    docs << "{\"text\": \"Give three tips for staying healthy.\"}\n{\"text\": \"What is the capital of France?\"}\n";
  }
  auto ppl = [&](const std::string& load, const std::string& extra) {
    auto e = testing::run_gale("evaluate --load " + load + " --use-checkpoint-args --tokenizer-type HuggingFaceTokenizer "
                               "--tokenizer-model " + kQwen + " --task ppl --task-data-path " + dir_.file("docs.jsonl") +
                               extra, dir_.path());
    EXPECT_EQ(e.exit_code, 0) << e.err << e.out;
    std::smatch m;
    EXPECT_TRUE(std::regex_search(e.out, m, std::regex(R"(\| lm loss: ([0-9.E+-]+) \|)"))) << e.out;
    return m.empty() ? 0.0 : std::stod(m[1]);
  };
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

TEST_F(LoraCli, FlagErrorsAreOneLine) {
  struct Case {
    std::vector<std::string> extra;
    const char* fragment;
  } cases[] = {
      {{"--lora-target-modules", "q_proj"}, "--lora-target-modules: expected linear_qkv, linear_proj, linear_fc1 or linear_fc2, found q_proj"},
      {{"--lora-r", "-1", "--lora-target-modules", "linear_qkv"}, "--lora-r: expected a positive integer, found -1"},
      {{"--lora-load", "/nonexistent"}, "--lora-load needs --lora-target-modules"},
      {{"--lora-modules-to-save", "word_embeddings", "--lora-target-modules", "linear_qkv"}, "--lora-modules-to-save: not supported yet"},
  };
  for (const Case& c : cases) {
    test::RunResult r = test::run_with_timeout(sft(dir_.file("sft"), 2, plus({"--lr", "1e-3"}, c.extra)), {}, 120);
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(c.fragment), std::string::npos) << r.output;
  }
}

}  // namespace
}  // namespace gale
