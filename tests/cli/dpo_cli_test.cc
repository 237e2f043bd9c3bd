// Offline DPO end to end: `gale preprocess --handler-name AlpacaStylePairwiseHandler` is
// byte-identical to tools/reference/pairwise_reference.py (an independent statement of
// MindSpeed-LLM's pairwise handler) for three templates; then a fine-tuned checkpoint trained with
// `gale pretrain --stage dpo --is-pairwise-dataset` starts at loss log 2 (reference = policy),
// the loss falls and rewards/accuracies is logged; data parallelism 2, tensor parallelism 2 (also
// with sequence parallelism), context parallelism 2 and pipeline parallelism 2 (1F1B, interleaved,
// with DP 2, DualPipeV) under mpirun reproduce one process, bf16 stays close to fp32; a
// separate --ref-model changes the start; errors are one line.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>

#include "cli/cli_test_util.h"
#include "cli/mpi_cli.h"
#include "data/data_test_util.h"
#include "subprocess.h"

namespace gale {
namespace {

using testing::read_file;
using testing::run_gale;
using testing::TempDir;

const std::string kRef = std::string(GALE_TEST_DATA_DIR) + "/reference/dpo";
const std::string kSft = std::string(GALE_TEST_DATA_DIR) + "/reference/sft";
const std::string kTok = std::string(GALE_TEST_DATA_DIR) + "/tokenizers/";
const std::string kQwen = kTok + "qwen2_style";
const std::string kFullKeys =
    "'{\"prompt\":\"instruction\",\"query\":\"input\",\"system\":\"system\",\"history\":\"history\","
    "\"chosen\":\"chosen\",\"rejected\":\"rejected\"}'";
const char* const kKeys[] = {"chosen_input_ids", "chosen_labels", "rejected_input_ids", "rejected_labels"};

std::string hf(const char* folder) { return "--tokenizer-type HuggingFaceTokenizer --tokenizer-model " + kTok + folder; }

std::string preprocess(const std::string& prefix, const std::string& flags) {
  return "preprocess --handler-name AlpacaStylePairwiseHandler --input " + kRef + "/pairwise.jsonl --output-prefix " +
         prefix + " " + flags;
}

TEST(DpoPreprocess, ByteIdenticalToTheReference) {
  const std::pair<const char*, std::string> runs[] = {
      {"qwen", hf("qwen2_style") + " --prompt-type qwen --seq-length 64 --map-keys " + kFullKeys},
      {"llama3", hf("llama3_style") + " --prompt-type llama3 --seq-length 96"},
      {"alpaca", hf("qwen2_style") + " --prompt-type alpaca --seq-length 120 --map-keys " + kFullKeys},
  };
  for (const auto& [name, flags] : runs) {
    SCOPED_TRACE(name);
    TempDir dir;
    auto r = run_gale(preprocess(dir.file("out"), flags), dir.path());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    for (const char* key : kKeys)
      for (const char* ext : {".bin", ".idx"}) {
        const std::string ours = read_file(dir.file(std::string("out_packed_") + key + "_document") + ext);
        const std::string ref = read_file(kRef + "/" + name + "_packed_" + key + "_document" + ext);
        ASSERT_FALSE(ref.empty());
        EXPECT_TRUE(ours == ref) << key << ext << " differs (" << ours.size() << " vs " << ref.size() << " bytes)";
      }
  }
}

TEST(DpoPreprocess, ReportsAndErrors) {
  TempDir dir;
  auto r = run_gale(preprocess(dir.file("out"), hf("qwen2_style") + " --prompt-type qwen --seq-length 64"), dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("7 records: 5 pairs written, 1 dropped with 64 or more tokens (--seq-length), 1 without "
                       "chosen/rejected responses skipped"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("out_packed_rejected_labels_document.bin"), std::string::npos) << r.out;
  auto packed = run_gale(preprocess(dir.file("p"), hf("qwen2_style") + " --prompt-type qwen --seq-length 64 --pack"),
                         dir.path());
  EXPECT_NE(packed.exit_code, 0);
  EXPECT_NE(packed.err.find("--pack, --neat-pack and --append-eod are not used by the pairwise handler"),
            std::string::npos)
      << packed.err;
  auto keys = run_gale(preprocess(dir.file("k"), hf("qwen2_style") + " --prompt-type qwen --seq-length 64 "
                                                                     "--map-keys '{\"chosen\":3}'"),
                       dir.path());
  EXPECT_NE(keys.exit_code, 0);
  EXPECT_NE(keys.err.find("--map-keys: the value of 'chosen' must be a column name"), std::string::npos) << keys.err;
}

std::vector<double> values(const std::string& output, const std::string& key) {
  std::vector<double> out;
  std::regex re("\\| " + key + ": ([0-9.E+-]+) \\|");
  for (std::sregex_iterator it(output.begin(), output.end(), re), end; it != end; ++it)
    out.push_back(std::stod((*it)[1]));
  return out;
}

// The tiny qwen-vocabulary model of the SFT tests, without dropout (exact comparisons).
std::vector<std::string> model_flags() {
  return {"pretrain", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "128",
          "--max-position-embeddings", "128", "--lr", "1e-3", "--log-interval", "1", "--eval-interval", "1000",
          "--eval-iters", "0", "--num-threads", "1", "--attention-dropout", "0", "--hidden-dropout", "0",
          "--split", "100,0,0", "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", kQwen};
}

// A fine-tuned starting point: `iters` SFT iterations on the SFT fixture, saved to `save`; `extra`
// model flags (MoE) come after the tiny model's.
void sft_checkpoint(const std::string& save, int iters, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> argv = {GALE_BINARY};
  for (const std::string& f : model_flags()) argv.push_back(f);
  argv.insert(argv.end(), extra.begin(), extra.end());
  for (const std::string& f : {std::string("--is-instruction-dataset"), std::string("--data-path"), kSft + "/qwen",
                               std::string("--micro-batch-size"), std::string("2"), std::string("--global-batch-size"),
                               std::string("4"), std::string("--train-iters"), std::to_string(iters),
                               std::string("--save"), save, std::string("--save-interval"), std::to_string(iters), std::string("--lr"), std::string("3e-3")})
    argv.push_back(f);
  test::RunResult r = test::run_with_timeout(argv, {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
}

std::vector<std::string> dpo(int np, const std::string& data, const std::string& load,
                             std::vector<std::string> extra) {
  std::vector<std::string> flags = model_flags();
  for (const std::string& f : {std::string("--stage"), std::string("dpo"), std::string("--is-pairwise-dataset"),
                               std::string("--data-path"), data, std::string("--load"), load,
                               std::string("--finetune"), std::string("--micro-batch-size"), std::string("1"),
                               std::string("--global-batch-size"), std::string("2"), std::string("--train-iters"),
                               std::string("8"), std::string("--dpo-beta"), std::string("0.5")})
    flags.push_back(f);
  flags.insert(flags.end(), extra.begin(), extra.end());
  return testing::launch_argv(np, {GALE_BINARY}, flags);
}

// The pairs (dir/pairs) and a 2-iteration fine-tuned checkpoint (dir/sft) DPO starts from.
void prepare_pairs_and_sft(const TempDir& dir, const std::vector<std::string>& model_extra = {}) {
  auto p = run_gale(preprocess(dir.file("pairs"), hf("qwen2_style") + " --prompt-type qwen --seq-length 64"),
                    dir.path());
  ASSERT_EQ(p.exit_code, 0) << p.err;
  ASSERT_NO_FATAL_FAILURE(sft_checkpoint(dir.file("sft"), 2, model_extra));
}

// Megatron's validation blocks with MindSpeed-LLM's DPO loss dict: where ("iteration 4", "iteration
// 8 on validation set"), rewards/accuracies and lm loss values; each PPL is exp(min(20, value)).
struct DpoValidation {
  std::string where;
  double accuracy = 0.0, loss = 0.0;
};
std::vector<DpoValidation> validations(const std::string& output) {
  std::vector<DpoValidation> out;
  const std::string num = "([0-9.E+-]+)";
  std::regex re(" validation loss at (iteration [0-9]+(?: on validation set)?) \\| rewards/accuracies value: " + num +
                " \\| rewards/accuracies PPL: " + num + " \\| lm loss value: " + num + " \\| lm loss PPL: " + num +
                " \\| \n");
  for (std::sregex_iterator it(output.begin(), output.end(), re), end; it != end; ++it) {
    const auto& m = *it;
    DpoValidation v{m[1], std::stod(m[2]), std::stod(m[4])};
    EXPECT_NEAR(std::stod(m[3]), std::exp(v.accuracy), 1e-6 * std::exp(v.accuracy)) << m[0];
    EXPECT_NEAR(std::stod(m[5]), std::exp(v.loss), 1e-6 * std::exp(v.loss)) << m[0];
    out.push_back(v);
  }
  return out;
}

TEST(DpoPretrain, PreprocessFineTuneThenDpoLowersTheLossAndDataParallelMatches) {
  TempDir dir;
  ASSERT_NO_FATAL_FAILURE(prepare_pairs_and_sft(dir));
  test::RunResult one = test::run_with_timeout(
      dpo(1, dir.file("pairs"), dir.file("sft"), {"--tensorboard-dir", dir.file("tb")}), {}, 300);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  std::string events;  // TensorBoard gets rewards/accuracies next to lm loss
  for (const auto& e : std::filesystem::directory_iterator(dir.file("tb"))) events += read_file(e.path().string());
  EXPECT_NE(events.find("rewards/accuracies"), std::string::npos);
  EXPECT_NE(events.find("lm loss"), std::string::npos);
  EXPECT_NE(one.output.find("> pairwise train: documents [0, 5) of 5"), std::string::npos) << one.output;
  EXPECT_NE(one.output.find("loaded the reference model from"), std::string::npos) << one.output;
  const std::vector<double> loss = values(one.output, "lm loss");
  ASSERT_EQ(loss.size(), 8u) << one.output;
  // Iteration 1: the reference is the policy itself, every log-ratio is 0 and the loss is log 2.
  EXPECT_NEAR(loss.front(), std::log(2.0), 1e-6) << one.output;
  EXPECT_LT(loss.back(), 0.8 * loss.front()) << one.output;
  EXPECT_FALSE(values(one.output, "rewards/accuracies").empty()) << one.output;
  EXPECT_LT(one.output.find("rewards/accuracies"), one.output.rfind("lm loss")) << "logged before lm loss";
  // --variable-seq-lengths: each micro-batch of pairs is cut to its longest sequence; same losses.
  test::RunResult variable =
      test::run_with_timeout(dpo(1, dir.file("pairs"), dir.file("sft"), {"--variable-seq-lengths"}), {}, 300);
  ASSERT_EQ(variable.exit_code, 0) << variable.output;
  EXPECT_NE(variable.output.find("active: variable-seq-lengths"), std::string::npos) << variable.output;
  const std::vector<double> loss_variable = values(variable.output, "lm loss");
  ASSERT_EQ(loss_variable.size(), loss.size()) << variable.output;
  for (size_t i = 0; i < loss.size(); ++i) EXPECT_NEAR(loss_variable[i], loss[i], 1e-5 * loss[i]) << i + 1;
  // Data parallelism 2 (one micro-batch per rank instead of two on one rank): the same losses.
  test::RunResult two = test::run_with_timeout(dpo(2, dir.file("pairs"), dir.file("sft"), {}), testing::kMpiEnv, 300);
  ASSERT_EQ(two.exit_code, 0) << two.output;
  const std::vector<double> loss2 = values(two.output, "lm loss");
  ASSERT_EQ(loss2.size(), loss.size()) << two.output;
  for (size_t i = 0; i < loss.size(); ++i) EXPECT_NEAR(loss2[i], loss[i], 1e-5 * loss[i]) << "iteration " << i + 1;
  EXPECT_EQ(values(two.output, "rewards/accuracies"), values(one.output, "rewards/accuracies"));
  // A reference model of its own (--ref-model: the fine-tuned model two iterations further): the
  // policy differs from it at the first step, so the loss is no longer log 2.
  ASSERT_NO_FATAL_FAILURE(sft_checkpoint(dir.file("sft4"), 4));
  test::RunResult other =
      test::run_with_timeout(dpo(1, dir.file("pairs"), dir.file("sft"), {"--ref-model", dir.file("sft4")}), {}, 300);
  ASSERT_EQ(other.exit_code, 0) << other.output;
  const std::vector<double> other_loss = values(other.output, "lm loss");
  ASSERT_FALSE(other_loss.empty()) << other.output;
  EXPECT_GT(std::abs(other_loss.front() - std::log(2.0)), 1e-3) << other.output;
  // A missing reference checkpoint: one line naming --ref-model.
  test::RunResult missing =
      test::run_with_timeout(dpo(1, dir.file("pairs"), dir.file("sft"), {"--ref-model", dir.file("none")}), {}, 300);
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.output.find("--ref-model " + dir.file("none") + ": expected a checkpoint directory"),
            std::string::npos)
      << missing.output;
  // An instruction dataset is not a pairwise one: one line naming the flag.
  test::RunResult wrong = test::run_with_timeout(dpo(1, kSft + "/qwen", dir.file("sft"), {}), {}, 300);
  EXPECT_NE(wrong.exit_code, 0);
  EXPECT_NE(wrong.output.find("(--is-pairwise-dataset)"), std::string::npos) << wrong.output;
}

// Tensor parallelism 2, with and without sequence parallelism (the vocabulary-parallel
// cross-entropy gives every TP rank each sequence's log-probability), and context parallelism 2
// (each sequence's sums all-reduced over the cp group): the one-process losses and accuracies. bf16 (bf16 policy and reference GEMMs): log 2 at the start (the reference is the
// policy), then close to the fp32 run, and the loss falls.
TEST(DpoPretrain, TensorAndContextParallelAndBf16RunsMatchOneFp32Process) {
  TempDir dir;
  ASSERT_NO_FATAL_FAILURE(prepare_pairs_and_sft(dir));
  test::RunResult one = test::run_with_timeout(dpo(1, dir.file("pairs"), dir.file("sft"), {}), {}, 300);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const std::vector<double> loss = values(one.output, "lm loss");
  ASSERT_EQ(loss.size(), 8u) << one.output;
  for (std::vector<std::string> layout :
       {std::vector<std::string>{"--tensor-model-parallel-size", "2"},
        std::vector<std::string>{"--tensor-model-parallel-size", "2", "--sequence-parallel"},
        // Sequences of 48 (the pairs are shorter): CP 2 cuts them into chunks of 12, rank 0 holding
        // positions [0, 12) and [36, 48), so the response labels (positions 34-45) of some pairs fall
        // on both cp ranks.
        std::vector<std::string>{"--context-parallel-size", "2", "--seq-length", "48"}}) {
    std::string trace;
    for (const std::string& f : layout) trace += f + " ";
    SCOPED_TRACE(trace);
    // The vocabulary padded as the one-process checkpoint's (1152 rows: a multiple of 64 x TP 2).
    layout.insert(layout.end(), {"--make-vocab-size-divisible-by", "64"});
    test::RunResult tp = test::run_with_timeout(dpo(2, dir.file("pairs"), dir.file("sft"), layout), testing::kMpiEnv, 300);
    ASSERT_EQ(tp.exit_code, 0) << tp.output;
    const std::vector<double> loss_tp = values(tp.output, "lm loss");
    ASSERT_EQ(loss_tp.size(), loss.size()) << tp.output;
    for (size_t i = 0; i < loss.size(); ++i) EXPECT_NEAR(loss_tp[i], loss[i], 1e-5 * loss[i]) << "iteration " << i + 1;
    EXPECT_EQ(values(tp.output, "rewards/accuracies"), values(one.output, "rewards/accuracies"));
  }
  test::RunResult bf16 = test::run_with_timeout(dpo(1, dir.file("pairs"), dir.file("sft"), {"--bf16"}), {}, 300);
  ASSERT_EQ(bf16.exit_code, 0) << bf16.output;
  const std::vector<double> loss_bf16 = values(bf16.output, "lm loss");
  ASSERT_EQ(loss_bf16.size(), loss.size()) << bf16.output;
  EXPECT_NEAR(loss_bf16.front(), std::log(2.0), 1e-6) << bf16.output;
  for (size_t i = 0; i < loss.size(); ++i) EXPECT_NEAR(loss_bf16[i], loss[i], 0.05 * loss[i]) << "iteration " << i + 1;
  EXPECT_LT(loss_bf16.back(), 0.8 * loss_bf16.front()) << bf16.output;
  // --reuse-fp32-param keeps the policy's masters exactly: the bf16 run's losses bit for bit.
  test::RunResult reuse = test::run_with_timeout(
      dpo(1, dir.file("pairs"), dir.file("sft"), {"--bf16", "--reuse-fp32-param"}), {}, 300);
  ASSERT_EQ(reuse.exit_code, 0) << reuse.output;
  EXPECT_EQ(values(reuse.output, "lm loss"), loss_bf16) << reuse.output;
}

// LoRA DPO: the policy is the fine-tuned model plus adapters (lora_B starts at 0) and the reference
// the fine-tuned model itself, without adapters: the loss starts at log 2 and falls.
TEST(DpoPretrain, LoraAdaptersTrainAgainstTheBaseModel) {
  TempDir dir;
  ASSERT_NO_FATAL_FAILURE(prepare_pairs_and_sft(dir));
  test::RunResult lora = test::run_with_timeout(
      dpo(1, dir.file("pairs"), dir.file("sft"),
          {"--lr", "1e-2", "--lora-r", "8", "--lora-alpha", "16", "--lora-target-modules", "linear_qkv", "linear_proj",
           "linear_fc1", "linear_fc2"}),
      {}, 300);
  ASSERT_EQ(lora.exit_code, 0) << lora.output;
  EXPECT_NE(lora.output.find("loaded the reference model from"), std::string::npos) << lora.output;
  const std::vector<double> loss = values(lora.output, "lm loss");
  ASSERT_EQ(loss.size(), 8u) << lora.output;
  EXPECT_NEAR(loss.front(), std::log(2.0), 1e-6) << lora.output;
  EXPECT_LT(loss.back(), 0.8 * loss.front()) << lora.output;
  // The adapters' run against a reference of its own: a further fine-tuned model is not the base,
  // so the first loss is not log 2.
  ASSERT_NO_FATAL_FAILURE(sft_checkpoint(dir.file("sft4"), 4));
  test::RunResult other = test::run_with_timeout(
      dpo(1, dir.file("pairs"), dir.file("sft"),
          {"--lora-r", "8", "--lora-alpha", "16", "--lora-target-modules", "linear_qkv", "--ref-model", dir.file("sft4")}),
      {}, 300);
  ASSERT_EQ(other.exit_code, 0) << other.output;
  const std::vector<double> other_loss = values(other.output, "lm loss");
  ASSERT_FALSE(other_loss.empty()) << other.output;
  EXPECT_GT(std::abs(other_loss.front() - std::log(2.0)), 1e-3) << other.output;
}

// Evaluation (--eval-interval / --eval-iters on the pairwise validation split, MindSpeed-LLM's
// DPO loss function forward only): Megatron's validation blocks with rewards/accuracies and lm loss
// at every --eval-interval and at the end, and in TensorBoard; data parallelism 2 reproduces them;
// --skip-train evaluates at the start (log 2 and accuracy 0: the reference is the policy); and the
// saved iteration-4 policy evaluated with --skip-train against the same reference gives the
// training run's iteration-4 values (the same validation pairs); context parallelism 2 and tensor
// parallelism 2 with sequence parallelism evaluate as one process.
TEST(DpoPretrain, EvaluatesTheValidationPairsAndSkipTrainOnlyEvaluates) {
  TempDir dir;
  ASSERT_NO_FATAL_FAILURE(prepare_pairs_and_sft(dir));
  const std::vector<std::string> eval = {"--split", "60,40,0", "--eval-interval", "4", "--eval-iters", "1"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), eval.begin(), eval.end());
    return extra;
  };
  test::RunResult one = test::run_with_timeout(
      dpo(1, dir.file("pairs"), dir.file("sft"),
          with({"--tensorboard-dir", dir.file("tb"), "--save", dir.file("dpo"), "--save-interval", "4"})),
      {}, 300);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_NE(one.output.find("> pairwise valid: documents [3, 5) of 5"), std::string::npos) << one.output;
  const std::vector<DpoValidation> v = validations(one.output);
  ASSERT_EQ(v.size(), 3u) << one.output;
  EXPECT_EQ(v[0].where, "iteration 4");
  EXPECT_EQ(v[1].where, "iteration 8");
  EXPECT_EQ(v[2].where, "iteration 8 on validation set");
  for (const DpoValidation& x : v) {
    EXPECT_GT(x.loss, 0.0) << x.where;
    EXPECT_GT(std::abs(x.loss - std::log(2.0)), 1e-3) << x.where << ": the policy has moved away from the reference";
    EXPECT_GE(x.accuracy, 0.0) << x.where;
    EXPECT_LE(x.accuracy, 1.0) << x.where;
  }
  std::string events;
  for (const auto& e : std::filesystem::directory_iterator(dir.file("tb"))) events += read_file(e.path().string());
  EXPECT_NE(events.find("rewards/accuracies validation"), std::string::npos);
  EXPECT_NE(events.find("lm loss validation vs samples"), std::string::npos);
  // Data parallelism 2: one micro-batch per rank, the same means.
  test::RunResult two = test::run_with_timeout(dpo(2, dir.file("pairs"), dir.file("sft"), with({})), testing::kMpiEnv, 300);
  ASSERT_EQ(two.exit_code, 0) << two.output;
  const std::vector<DpoValidation> v2 = validations(two.output);
  ASSERT_EQ(v2.size(), v.size()) << two.output;
  for (size_t i = 0; i < v.size(); ++i) {
    EXPECT_EQ(v2[i].where, v[i].where);
    EXPECT_NEAR(v2[i].loss, v[i].loss, 1e-5 * v[i].loss) << v[i].where;
    EXPECT_EQ(v2[i].accuracy, v[i].accuracy) << v[i].where;
  }
  // --skip-train: no iteration, one evaluation of the fine-tuned policy against itself.
  test::RunResult skip = test::run_with_timeout(dpo(1, dir.file("pairs"), dir.file("sft"), with({"--skip-train"})), {}, 300);
  ASSERT_EQ(skip.exit_code, 0) << skip.output;
  EXPECT_NE(skip.output.find("skipping training (--skip-train is on) ..."), std::string::npos) << skip.output;
  EXPECT_TRUE(values(skip.output, "lm loss").empty()) << skip.output;
  const std::vector<DpoValidation> at_start = validations(skip.output);
  ASSERT_EQ(at_start.size(), 1u) << skip.output;
  EXPECT_EQ(at_start[0].where, "iteration 0 on validation set");
  EXPECT_NEAR(at_start[0].loss, std::log(2.0), 1e-6) << skip.output;
  EXPECT_EQ(at_start[0].accuracy, 0.0) << skip.output;
  // The policy saved at iteration 4, the fine-tuned model as reference: the validation pairs the
  // training run evaluated at iteration 4 (the first of the split), the same values.
  {
    std::ofstream latest(dir.file("dpo") + "/latest_checkpointed_iteration.txt", std::ios::trunc);
    latest << "4";
  }
  test::RunResult at4 = test::run_with_timeout(
      dpo(1, dir.file("pairs"), dir.file("dpo"), with({"--skip-train", "--ref-model", dir.file("sft")})), {}, 300);
  ASSERT_EQ(at4.exit_code, 0) << at4.output;
  const std::vector<DpoValidation> v4 = validations(at4.output);
  ASSERT_EQ(v4.size(), 1u) << at4.output;
  EXPECT_NEAR(v4[0].loss, v[0].loss, 1e-6 * v[0].loss) << at4.output;
  EXPECT_EQ(v4[0].accuracy, v[0].accuracy) << at4.output;
  // Context parallelism 2 and tensor parallelism 2 with sequence parallelism evaluate as one
  // process (sequences of 48, as the training comparison's CP run; evaluation every 2 of 4 iterations).
  const std::vector<std::string> short_eval = {"--seq-length", "48", "--train-iters", "4", "--eval-interval", "2"};
  test::RunResult base = test::run_with_timeout(dpo(1, dir.file("pairs"), dir.file("sft"), with(short_eval)), {}, 300);
  ASSERT_EQ(base.exit_code, 0) << base.output;
  const std::vector<DpoValidation> vb = validations(base.output);
  ASSERT_EQ(vb.size(), 3u) << base.output;
  for (std::vector<std::string> layout :
       {std::vector<std::string>{"--context-parallel-size", "2"},
        std::vector<std::string>{"--tensor-model-parallel-size", "2", "--sequence-parallel",
                                 "--make-vocab-size-divisible-by", "64"}}) {
    SCOPED_TRACE(layout.front());
    layout.insert(layout.begin(), short_eval.begin(), short_eval.end());
    test::RunResult r =
        test::run_with_timeout(dpo(2, dir.file("pairs"), dir.file("sft"), with(layout)), testing::kMpiEnv, 300);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::vector<DpoValidation> vr = validations(r.output);
    ASSERT_EQ(vr.size(), vb.size()) << r.output;
    for (size_t i = 0; i < vb.size(); ++i) {
      EXPECT_NEAR(vr[i].loss, vb[i].loss, 1e-5 * vb[i].loss) << vb[i].where;
      EXPECT_EQ(vr[i].accuracy, vb[i].accuracy) << vb[i].where;
    }
  }
}

// --refer-model-iter (MindSpeed-LLM, default 1): a DPO run saved at iterations 1 and 2, resumed
// from its own directory, takes the policy from iteration 2 and by default the reference from
// iteration 1 (the loss at the start is not log 2); --refer-model-iter 2 makes the reference the
// policy (log 2 exactly); an iteration the directory lacks is an error naming the flag and those
// found; without the flag, a directory without iteration 1 gives the reference its latest.
TEST(DpoPretrain, ReferModelIterChoosesTheReferenceCheckpoint) {
  TempDir dir;
  ASSERT_NO_FATAL_FAILURE(prepare_pairs_and_sft(dir));
  const std::vector<std::string> eval = {"--split", "60,40,0", "--eval-interval", "4", "--eval-iters", "1"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), eval.begin(), eval.end());
    return extra;
  };
  test::RunResult trained = test::run_with_timeout(
      dpo(1, dir.file("pairs"), dir.file("sft"), with({"--train-iters", "2", "--save", dir.file("dpo"),
                                                       "--save-interval", "1", "--lr", "3e-2"})),
      {}, 300);
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  EXPECT_NE(trained.output.find("has no iteration 1 (--refer-model-iter's default): the reference loads its latest "
                                "checkpoint"),
            std::string::npos)
      << trained.output;
  auto start_loss = [&](const std::vector<std::string>& extra, double* loss) {
    std::vector<std::string> flags = with({"--skip-train"});
    flags.insert(flags.end(), extra.begin(), extra.end());
    test::RunResult r = test::run_with_timeout(dpo(1, dir.file("pairs"), dir.file("dpo"), flags), {}, 300);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::vector<DpoValidation> v = validations(r.output);
    ASSERT_EQ(v.size(), 1u) << r.output;
    *loss = v[0].loss;
  };
  double by_default = 0.0, at_one = 0.0, at_two = 0.0;
  ASSERT_NO_FATAL_FAILURE(start_loss({}, &by_default));
  ASSERT_NO_FATAL_FAILURE(start_loss({"--refer-model-iter", "1"}, &at_one));
  ASSERT_NO_FATAL_FAILURE(start_loss({"--refer-model-iter", "2"}, &at_two));
  EXPECT_NEAR(at_two, std::log(2.0), 1e-6);
  EXPECT_GT(std::abs(by_default - std::log(2.0)), 1e-4) << "the reference took the policy's weights";
  EXPECT_EQ(by_default, at_one);
  test::RunResult missing = test::run_with_timeout(
      dpo(1, dir.file("pairs"), dir.file("dpo"), with({"--skip-train", "--refer-model-iter", "7"})), {}, 300);
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.output.find("--refer-model-iter 7: the reference checkpoint directory " + dir.file("dpo") +
                                " has no iter_0000007 (found: iter_0000001, iter_0000002)"),
            std::string::npos)
      << missing.output;
}

// MoE policy and reference (4 experts, top-2, load-balancing loss): the loss starts at log 2 and
// falls, load_balancing_loss is logged; expert parallelism 2 (with data parallelism 2: the expert
// layers' tokens exchanged by all-to-all in both models' forwards) reproduces one process's losses,
// accuracies, auxiliary losses and validation values.
TEST(DpoPretrain, MoeExpertParallelMatchesOneProcess) {
  TempDir dir;
  const std::vector<std::string> moe = {"--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "64",
                                        "--moe-aux-loss-coeff", "1e-2", "--moe-token-dispatcher-type", "alltoall"};
  ASSERT_NO_FATAL_FAILURE(prepare_pairs_and_sft(dir, moe));
  std::vector<std::string> flags = moe;
  flags.insert(flags.end(), {"--split", "60,40,0", "--eval-interval", "4", "--eval-iters", "1"});
  test::RunResult one = test::run_with_timeout(dpo(1, dir.file("pairs"), dir.file("sft"), flags), {}, 300);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const std::vector<double> loss = values(one.output, "lm loss");
  ASSERT_EQ(loss.size(), 8u) << one.output;
  EXPECT_NEAR(loss.front(), std::log(2.0), 1e-6) << one.output;
  EXPECT_LT(loss.back(), 0.8 * loss.front()) << one.output;
  const std::vector<double> balance = values(one.output, "load_balancing_loss");
  ASSERT_EQ(balance.size(), loss.size()) << one.output;
  const std::vector<DpoValidation> v = validations(one.output);
  ASSERT_EQ(v.size(), 3u) << one.output;
  flags.insert(flags.end(), {"--expert-model-parallel-size", "2"});
  test::RunResult ep = test::run_with_timeout(dpo(2, dir.file("pairs"), dir.file("sft"), flags), testing::kMpiEnv, 300);
  ASSERT_EQ(ep.exit_code, 0) << ep.output;
  const std::vector<double> loss_ep = values(ep.output, "lm loss");
  const std::vector<double> balance_ep = values(ep.output, "load_balancing_loss");
  ASSERT_EQ(loss_ep.size(), loss.size()) << ep.output;
  ASSERT_EQ(balance_ep.size(), balance.size()) << ep.output;
  for (size_t i = 0; i < loss.size(); ++i) {
    EXPECT_NEAR(loss_ep[i], loss[i], 1e-5 * loss[i]) << "iteration " << i + 1;
    EXPECT_NEAR(balance_ep[i], balance[i], 1e-5 * balance[i]) << "iteration " << i + 1;
  }
  EXPECT_EQ(values(ep.output, "rewards/accuracies"), values(one.output, "rewards/accuracies"));
  const std::vector<DpoValidation> v_ep = validations(ep.output);
  ASSERT_EQ(v_ep.size(), v.size()) << ep.output;
  for (size_t i = 0; i < v.size(); ++i) {
    EXPECT_NEAR(v_ep[i].loss, v[i].loss, 1e-5 * v[i].loss) << v[i].where;
    EXPECT_EQ(v_ep[i].accuracy, v[i].accuracy) << v[i].where;
  }
}

// The values of a log-line field with padding ("global batch size:     2 |", "grad norm: 5.290 |").
std::vector<double> padded_values(const std::string& output, const std::string& key) {
  std::vector<double> out;
  std::regex re("\\| " + key + ": +([0-9.E+-]+) \\|");
  for (std::sregex_iterator it(output.begin(), output.end(), re), end; it != end; ++it)
    out.push_back(std::stod((*it)[1]));
  return out;
}

// The argv without its "--train-iters N" (sample-based training for --rampup-batch-size).
std::vector<std::string> without_train_iters(std::vector<std::string> argv) {
  auto it = std::find(argv.begin(), argv.end(), "--train-iters");
  if (it != argv.end()) argv.erase(it, it + 2);
  return argv;
}

// --fp16 with loss scaling: the policy's per-token loss gradients and auxiliary losses start from
// the loss scale (unscaled before the step), so the fp16 run starts at log 2 and follows the fp32
// run, its logged (unscaled) gradient norms included. --rampup-batch-size: the micro-batch count
// changes with the global batch size and the DPO objective stays the mean over micro-batches, so
// data parallelism 2 (half the micro-batches per rank) reproduces one process, gradient norms
// included.
TEST(DpoPretrain, Fp16LossScalingAndRampupBatchSize) {
  TempDir dir;
  ASSERT_NO_FATAL_FAILURE(prepare_pairs_and_sft(dir));
  test::RunResult fp32 = test::run_with_timeout(dpo(1, dir.file("pairs"), dir.file("sft"), {}), {}, 300);
  ASSERT_EQ(fp32.exit_code, 0) << fp32.output;
  test::RunResult fp16 = test::run_with_timeout(
      dpo(1, dir.file("pairs"), dir.file("sft"), {"--fp16", "--initial-loss-scale", "1024"}), {}, 300);
  ASSERT_EQ(fp16.exit_code, 0) << fp16.output;
  const std::vector<double> loss = values(fp32.output, "lm loss"), loss16 = values(fp16.output, "lm loss");
  const std::vector<double> norm = padded_values(fp32.output, "grad norm");
  const std::vector<double> norm16 = padded_values(fp16.output, "grad norm");
  ASSERT_EQ(loss.size(), 8u) << fp32.output;
  ASSERT_EQ(loss16.size(), loss.size()) << fp16.output;
  ASSERT_EQ(norm16.size(), norm.size()) << fp16.output;
  EXPECT_EQ(padded_values(fp16.output, "loss scale").front(), 1024.0) << fp16.output;
  EXPECT_NEAR(loss16.front(), std::log(2.0), 1e-6) << fp16.output;
  for (size_t i = 0; i < loss.size(); ++i) {
    EXPECT_NEAR(loss16[i], loss[i], 2e-3 * loss[i]) << "iteration " << i + 1;
    EXPECT_NEAR(norm16[i], norm[i], 1e-2 * norm[i]) << "iteration " << i + 1;
  }
  // Global batch size 2 for 8 pairs, then 4 (16 pairs in all, 6 iterations).
  const std::vector<std::string> ramp = {"--global-batch-size", "4", "--train-samples", "16", "--rampup-batch-size",
                                         "2", "2", "8"};
  test::RunResult one = test::run_with_timeout(without_train_iters(dpo(1, dir.file("pairs"), dir.file("sft"), ramp)),
                                               {}, 300);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_EQ(padded_values(one.output, "global batch size"), (std::vector<double>{2, 2, 2, 2, 4, 4})) << one.output;
  test::RunResult two = test::run_with_timeout(without_train_iters(dpo(2, dir.file("pairs"), dir.file("sft"), ramp)),
                                               testing::kMpiEnv, 300);
  ASSERT_EQ(two.exit_code, 0) << two.output;
  const std::vector<double> l1 = values(one.output, "lm loss"), l2 = values(two.output, "lm loss");
  const std::vector<double> n1 = padded_values(one.output, "grad norm"), n2 = padded_values(two.output, "grad norm");
  ASSERT_EQ(l1.size(), 6u) << one.output;
  ASSERT_EQ(l2.size(), l1.size()) << two.output;
  ASSERT_EQ(n2.size(), n1.size()) << two.output;
  for (size_t i = 0; i < l1.size(); ++i) {
    EXPECT_NEAR(l2[i], l1[i], 1e-5 * l1[i]) << "iteration " << i + 1;
    EXPECT_NEAR(n2[i], n1[i], 1e-3 * n1[i]) << "iteration " << i + 1;
  }
}

// Pipeline parallelism (a 4-layer model): 1F1B over two stages, the interleaved schedule (two
// virtual stages of one layer per rank), PP 2 x DP 2 and DualPipeV (with and without
// --dualpipev-dw-detach; global batch 4, its 2·P micro-batches) reproduce one process's losses,
// gradient norms, rewards/accuracies and validation values (the reference model's forwards run
// through the same pipeline, each stage holding its layers); a PP 2 run saved at iteration 4 and
// resumed (--ref-model the fine-tuned model) continues with the uninterrupted run's losses.
TEST(DpoPretrain, PipelineParallelMatchesOneProcessAndResumes) {
  TempDir dir;
  const std::vector<std::string> layers = {"--num-layers", "4"};
  ASSERT_NO_FATAL_FAILURE(prepare_pairs_and_sft(dir, layers));
  std::vector<std::string> flags = layers;
  flags.insert(flags.end(), {"--split", "60,40,0", "--eval-interval", "4", "--eval-iters", "1"});
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), flags.begin(), flags.end());
    return extra;
  };
  // `np` ranks with `layout` give `one`'s losses, gradient norms, accuracies and validation values.
  auto expect_same = [&](const test::RunResult& one, int np, const std::vector<std::string>& layout) {
    std::string trace = "np " + std::to_string(np);
    for (const std::string& f : layout) trace += " " + f;
    SCOPED_TRACE(trace);
    const std::vector<double> loss = values(one.output, "lm loss"), norm = padded_values(one.output, "grad norm");
    const std::vector<DpoValidation> v = validations(one.output);
    test::RunResult pp =
        test::run_with_timeout(dpo(np, dir.file("pairs"), dir.file("sft"), with(layout)), testing::kMpiEnv, 300);
    ASSERT_EQ(pp.exit_code, 0) << pp.output;
    const std::vector<double> loss_pp = values(pp.output, "lm loss"), norm_pp = padded_values(pp.output, "grad norm");
    ASSERT_EQ(loss_pp.size(), loss.size()) << pp.output;
    ASSERT_EQ(norm_pp.size(), norm.size()) << pp.output;
    for (size_t i = 0; i < loss.size(); ++i) {
      EXPECT_NEAR(loss_pp[i], loss[i], 1e-5 * loss[i]) << "iteration " << i + 1;
      EXPECT_NEAR(norm_pp[i], norm[i], 1e-4 * norm[i]) << "iteration " << i + 1;
    }
    EXPECT_EQ(values(pp.output, "rewards/accuracies"), values(one.output, "rewards/accuracies"));
    const std::vector<DpoValidation> v_pp = validations(pp.output);
    ASSERT_EQ(v_pp.size(), v.size()) << pp.output;
    for (size_t i = 0; i < v.size(); ++i) {
      EXPECT_EQ(v_pp[i].where, v[i].where);
      EXPECT_NEAR(v_pp[i].loss, v[i].loss, 1e-5 * v[i].loss) << v[i].where;
      EXPECT_EQ(v_pp[i].accuracy, v[i].accuracy) << v[i].where;
    }
  };
  test::RunResult one = test::run_with_timeout(dpo(1, dir.file("pairs"), dir.file("sft"), with({})), {}, 300);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const std::vector<double> loss = values(one.output, "lm loss");
  ASSERT_EQ(loss.size(), 8u) << one.output;
  ASSERT_EQ(padded_values(one.output, "grad norm").size(), loss.size()) << one.output;
  EXPECT_NEAR(loss.front(), std::log(2.0), 1e-6) << one.output;
  ASSERT_EQ(validations(one.output).size(), 3u) << one.output;
  expect_same(one, 2, {"--pipeline-model-parallel-size", "2", "--save", dir.file("pp2"), "--save-interval", "4"});
  expect_same(one, 2, {"--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1"});
  expect_same(one, 4, {"--pipeline-model-parallel-size", "2"});
  const std::vector<std::string> batch4 = {"--global-batch-size", "4", "--train-iters", "4", "--eval-interval", "2"};
  test::RunResult one4 = test::run_with_timeout(dpo(1, dir.file("pairs"), dir.file("sft"), with(batch4)), {}, 300);
  ASSERT_EQ(one4.exit_code, 0) << one4.output;
  ASSERT_EQ(values(one4.output, "lm loss").size(), 4u) << one4.output;
  for (const char* detach : {"", "--dualpipev-dw-detach"}) {
    std::vector<std::string> layout = batch4;
    layout.insert(layout.end(), {"--pipeline-model-parallel-size", "2", "--schedules-method", "dualpipev"});
    if (*detach) layout.push_back(detach);
    expect_same(one4, 2, layout);
  }
  // Resume the PP 2 run from its iteration-4 checkpoint (not --finetune: the iteration, optimizer
  // and consumed samples come back) against the fine-tuned reference: iterations 5-8 as before.
  std::vector<std::string> resume = dpo(2, dir.file("pairs"), dir.file("pp2"),
                                        with({"--pipeline-model-parallel-size", "2", "--ref-model", dir.file("sft")}));
  resume.erase(std::find(resume.begin(), resume.end(), "--finetune"));
  {
    std::ofstream latest(dir.file("pp2") + "/latest_checkpointed_iteration.txt", std::ios::trunc);
    latest << "4";
  }
  test::RunResult resumed = test::run_with_timeout(resume, testing::kMpiEnv, 300);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const std::vector<double> loss_resumed = values(resumed.output, "lm loss");
  ASSERT_EQ(loss_resumed.size(), 4u) << resumed.output;
  for (size_t i = 0; i < loss_resumed.size(); ++i)
    EXPECT_NEAR(loss_resumed[i], loss[4 + i], 1e-5 * loss[4 + i]) << "iteration " << i + 5;
}

}  // namespace
}  // namespace gale
