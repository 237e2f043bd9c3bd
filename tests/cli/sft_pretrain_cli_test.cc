// Fine-tuning on instruction data end to end: `gale preprocess --handler-name
// AlpacaStyleInstructionHandler` (with and without --pack) then `gale pretrain
// --is-instruction-dataset` prints a falling loss; --variable-seq-lengths changes the cost, not
// the losses; flag errors are one line.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>

#include "cli/cli_test_util.h"
#include "data/data_test_util.h"
#include "cli/mpi_cli.h"
#include "subprocess.h"

namespace gale {
namespace {

const std::string kRef = std::string(GALE_TEST_DATA_DIR) + "/reference/sft";
const std::string kQwen = std::string(GALE_TEST_DATA_DIR) + "/tokenizers/qwen2_style";

std::vector<std::string> sft(const std::string& prefix, std::vector<std::string> extra) {
  std::vector<std::string> argv = {
      GALE_BINARY, "pretrain", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
      "--seq-length", "128", "--max-position-embeddings", "128", "--micro-batch-size", "2", "--global-batch-size", "4",
      "--train-iters", "12", "--lr", "3e-3", "--log-interval", "1", "--eval-interval", "1000", "--eval-iters", "0",
      "--num-threads", "1", "--is-instruction-dataset", "--data-path", prefix, "--split", "100,0,0",
      "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", kQwen};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

std::vector<double> losses(const std::string& output) {
  std::vector<double> out;
  std::regex re(R"(\| lm loss: ([0-9.E+-]+) \|)");
  for (std::sregex_iterator it(output.begin(), output.end(), re), end; it != end; ++it)
    out.push_back(std::stod((*it)[1]));
  return out;
}

TEST(SftPretrain, PreprocessThenTrainLowersTheLoss) {
  testing::TempDir dir;
  auto p = testing::run_gale("preprocess --handler-name AlpacaStyleInstructionHandler --input " + kRef +
                                 "/alpaca.jsonl --output-prefix " + dir.file("sft") +
                                 " --tokenizer-type HuggingFaceTokenizer --tokenizer-model " + kQwen +
                                 " --prompt-type qwen --seq-length 128",
                             dir.path());
  ASSERT_EQ(p.exit_code, 0) << p.err;
  test::RunResult r = test::run_with_timeout(sft(dir.file("sft"), {}), {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("> instruction train: documents [0, 6) of 6"), std::string::npos) << r.output;
  std::vector<double> l = losses(r.output);
  ASSERT_EQ(l.size(), 12u) << r.output;
  EXPECT_LT(l.back(), 0.8 * l.front()) << r.output;  // about 7.1 -> 5.1
}

TEST(SftPretrain, TrainsOnPackedData) {
  testing::TempDir dir;
  auto p = testing::run_gale("preprocess --handler-name AlpacaStyleInstructionHandler --input " + kRef +
                                 "/alpaca.jsonl --output-prefix " + dir.file("sft") +
                                 " --tokenizer-type HuggingFaceTokenizer --tokenizer-model " + kQwen +
                                 " --prompt-type qwen --seq-length 128 --pack",
                             dir.path());
  ASSERT_EQ(p.exit_code, 0) << p.err;
  EXPECT_NE(p.out.find(" packs written"), std::string::npos) << p.out;
  test::RunResult r = test::run_with_timeout(sft(dir.file("sft"), {}), {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(losses(r.output).size(), 12u) << r.output;
}

double peak_tensor_mib(const std::string& output) {
  std::smatch m;
  if (!std::regex_search(output, m, std::regex(R"(peak memory: ([0-9.]+) MiB in tensors)"))) return -1;
  return std::stod(m[1]);
}

// --variable-seq-lengths pads each micro-batch to its longest sample (the fixture's documents are
// 20-70 tokens, --seq-length 128): the padding has loss mask 0 and comes after every real token,
// so the losses are those of the full-length run, while the activations (the exact peak of the
// tensor allocator) shrink. Pipeline stages each take every micro-batch's own shape.
TEST(SftPretrain, VariableSeqLengthsKeepTheLossesAndShrinkTheMicroBatches) {
  const std::string prefix = kRef + "/qwen";
  const std::vector<std::string> exact = {"--attention-dropout", "0", "--hidden-dropout", "0", "--train-iters", "6"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), exact.begin(), exact.end());
    return sft(prefix, extra);
  };
  test::RunResult fixed = test::run_with_timeout(with({}), {}, 300);
  ASSERT_EQ(fixed.exit_code, 0) << fixed.output;
  test::RunResult variable = test::run_with_timeout(with({"--variable-seq-lengths"}), {}, 300);
  ASSERT_EQ(variable.exit_code, 0) << variable.output;
  EXPECT_NE(variable.output.find("active: variable-seq-lengths (multimodal, level 2)"), std::string::npos)
      << variable.output;
  const std::vector<double> a = losses(fixed.output), b = losses(variable.output);
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), a.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-5 * a[i]) << "iteration " << i + 1;
  const double fixed_peak = peak_tensor_mib(fixed.output), variable_peak = peak_tensor_mib(variable.output);
  ASSERT_GT(fixed_peak, 0) << fixed.output;
  EXPECT_LT(variable_peak, 0.85 * fixed_peak) << variable.output;
  // Below level 2 the flag is reported and the micro-batches stay --seq-length long.
  test::RunResult level1 = test::run_with_timeout(with({"--variable-seq-lengths", "--optimization-level", "1"}), {}, 300);
  ASSERT_EQ(level1.exit_code, 0) << level1.output;
  EXPECT_NE(level1.output.find("--variable-seq-lengths is not active: it needs --optimization-level 2 (given 1)"),
            std::string::npos)
      << level1.output;
  EXPECT_EQ(peak_tensor_mib(level1.output), fixed_peak);
  // Two pipeline stages: the transfers of each micro-batch have its own length; same losses.
  std::vector<std::string> pp = {GALE_MPIEXEC, "--oversubscribe", "--bind-to", "none", "-np", "2"};
  std::vector<std::string> argv = with({"--variable-seq-lengths", "--pipeline-model-parallel-size", "2"});
  pp.insert(pp.end(), argv.begin(), argv.end());
  test::RunResult piped = test::run_with_timeout(
      pp, testing::kMpiEnv, 300);
  ASSERT_EQ(piped.exit_code, 0) << piped.output;
  const std::vector<double> c = losses(piped.output);
  ASSERT_EQ(c.size(), a.size()) << piped.output;
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(c[i], a[i], 1e-5 * a[i]) << "iteration " << i + 1;
  // Without an instruction dataset every sample is --seq-length long: a notice, nothing else.
  test::RunResult mock = test::run_with_timeout(
      {GALE_BINARY, "pretrain", "--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2",
       "--seq-length", "16", "--max-position-embeddings", "16", "--micro-batch-size", "1", "--train-iters", "1",
       "--lr", "1e-3", "--mock-data", "--vocab-size", "4096", "--eval-iters", "0", "--num-threads", "1",
       "--variable-seq-lengths"},
      {}, 120);
  ASSERT_EQ(mock.exit_code, 0) << mock.output;
  EXPECT_NE(mock.output.find("--variable-seq-lengths is not active: pretraining samples are always --seq-length "
                             "tokens"),
            std::string::npos)
      << mock.output;
  // Context parallelism splits whole --seq-length sequences: refused, naming both flags.
  test::RunResult cp = test::run_with_timeout(
      {GALE_BINARY, "features", "--variable-seq-lengths", "--context-parallel-size", "2", "--is-instruction-dataset"},
      {}, 60);
  EXPECT_NE(cp.exit_code, 0);
  EXPECT_NE(cp.output.find("--variable-seq-lengths with --context-parallel-size 2: not supported"), std::string::npos)
      << cp.output;
}

// Neat packing is exact: with --reset-attention-mask --reset-position-ids every packed sample sees
// only itself, from position 0, so one micro-batch holding all neat packs has the loss of one
// micro-batch holding the same samples unpacked (the mean over the same labelled tokens). Without
// the resets the packed samples see each other and the loss differs.
TEST(SftPretrain, NeatPacksHaveTheLossOfTheirSamplesUnpacked) {
  testing::TempDir dir;
  {
    std::ofstream in(dir.file("short.jsonl"));
    for (const char* r : {R"({"instruction": "Name a colour.", "input": "", "output": "Blue."})",
                          R"({"instruction": "Add the numbers.", "input": "2 and 3", "output": "5"})",
                          R"({"instruction": "Greet me.", "input": "", "output": "Hello there!"})",
                          R"({"instruction": "Say a word.", "input": "", "output": "Word."})",
                          R"({"instruction": "", "input": "only an input", "output": "ok"})"})
      in << r << "\n";
  }
  auto prep = [&](const std::string& out, const std::string& flags) {
    auto p = testing::run_gale("preprocess --handler-name AlpacaStyleInstructionHandler --input " +
                                   dir.file("short.jsonl") + " --output-prefix " + dir.file(out) +
                                   " --tokenizer-type HuggingFaceTokenizer --tokenizer-model " + kQwen +
                                   " --prompt-type qwen --seq-length 128 " + flags,
                               dir.path());
    EXPECT_EQ(p.exit_code, 0) << p.err;
    return p.out;
  };
  prep("plain", "");
  const std::string packed = prep("neat", "--pack --neat-pack");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(packed, m, std::regex(R"((\d+) packs written)"))) << packed;
  const std::string packs = m[1];
  ASSERT_NE(packs, "5") << "the five samples must share packs";
  auto first_loss = [&](const std::string& prefix, const std::string& mbs, std::vector<std::string> extra) {
    std::vector<std::string> flags = {"--micro-batch-size", mbs, "--global-batch-size", mbs, "--train-iters", "1",
                                      "--attention-dropout", "0", "--hidden-dropout", "0"};
    flags.insert(flags.end(), extra.begin(), extra.end());
    test::RunResult r = test::run_with_timeout(sft(dir.file(prefix), flags), {}, 300);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    std::vector<double> l = losses(r.output);
    return l.empty() ? -1.0 : l[0];
  };
  const double unpacked = first_loss("plain", "5", {});
  const double neat = first_loss("neat", packs, {"--neat-pack", "--reset-attention-mask", "--reset-position-ids"});
  EXPECT_NEAR(neat, unpacked, 1e-5 * unpacked);
  const double leaky = first_loss("neat", packs, {});
  EXPECT_GT(std::abs(leaky - unpacked), 1e-4 * unpacked);
  // The resets are what makes it exact; --neat-pack alone is refused as MindSpeed-LLM does.
  test::RunResult r = test::run_with_timeout(sft(dir.file("neat"), {"--neat-pack"}), {}, 120);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--neat-pack requires --reset-attention-mask"), std::string::npos) << r.output;
}

TEST(SftPretrain, FlagErrorsAreOneLine) {
  const std::string prefix = kRef + "/qwen";
  struct Case {
    std::vector<std::string> extra;
    const char* fragment;
  } cases[] = {
      {{"--seq-length", "32", "--max-position-embeddings", "32"}, "more than --seq-length 32"},
      {{"--reset-position-ids"}, "--reset-position-ids with --is-instruction-dataset requires --reset-attention-mask"},
      {{"--eod-mask-loss"}, "--is-instruction-dataset with --eod-mask-loss: not supported"},
  };
  for (const Case& c : cases) {
    test::RunResult r = test::run_with_timeout(sft(prefix, c.extra), {}, 120);
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(c.fragment), std::string::npos) << r.output;
  }
  test::RunResult missing = test::run_with_timeout(sft(kRef + "/nothing", {}), {}, 120);
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.output.find("nothing_packed_input_ids_document"), std::string::npos) << missing.output;
}

}  // namespace
}  // namespace gale
