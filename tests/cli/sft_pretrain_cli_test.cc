// Fine-tuning on instruction data end to end: `gale preprocess --handler-name
// AlpacaStyleInstructionHandler` (with and without --pack) then `gale pretrain
// --is-instruction-dataset` prints a falling loss; flag errors are one line.
#include <gtest/gtest.h>

#include <regex>

#include "cli/cli_test_util.h"
#include "data/data_test_util.h"
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

TEST(SftPretrain, FlagErrorsAreOneLine) {
  const std::string prefix = kRef + "/qwen";
  struct Case {
    std::vector<std::string> extra;
    const char* fragment;
  } cases[] = {
      {{"--seq-length", "32", "--max-position-embeddings", "32"}, "more than --seq-length 32"},
      {{"--reset-position-ids"}, "--is-instruction-dataset with --reset-position-ids"},
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
