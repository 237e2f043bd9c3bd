// `gale preprocess --handler-name AlpacaStyleInstructionHandler`: byte-identical to the datasets of
// tools/reference/sft_reference.py (an independent statement of MindSpeed-LLM's rules with the HF
// tokenizers library) for the empty, qwen, alpaca and llama3 templates, with and without --pack,
// and with --pack --neat-pack; clear errors otherwise.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "cli/cli_test_util.h"
#include "data/data_test_util.h"

namespace gale {
namespace {

using testing::read_file;
using testing::run_gale;
using testing::TempDir;

const std::string kRef = std::string(GALE_TEST_DATA_DIR) + "/reference/sft";
const std::string kTok = std::string(GALE_TEST_DATA_DIR) + "/tokenizers/";
const std::string kFullKeys =
    "'{\"prompt\":\"instruction\",\"query\":\"input\",\"response\":\"output\",\"system\":\"system\","
    "\"history\":\"history\"}'";

struct SftRun {
  const char* name;
  std::string flags;
  const char* input = "alpaca.jsonl";
};

std::string hf(const char* folder) {
  return "--tokenizer-type HuggingFaceTokenizer --tokenizer-model " + kTok + folder;
}

TEST(SftPreprocess, ByteIdenticalToTheReferenceForEveryTemplate) {
  const SftRun runs[] = {
      {"qwen", hf("qwen2_style") + " --prompt-type qwen --seq-length 120 --map-keys " + kFullKeys},
      {"empty_eod", hf("qwen2_style") + " --prompt-type empty --seq-length 120 --append-eod"},
      {"alpaca_eod", hf("qwen2_style") + " --prompt-type alpaca --seq-length 160 --append-eod --map-keys " + kFullKeys},
      {"llama3", hf("llama3_style") + " --prompt-type llama3 --seq-length 200 --map-keys " + kFullKeys},
      {"qwen_pack", hf("qwen2_style") + " --prompt-type qwen --seq-length 120 --pack --map-keys " + kFullKeys},
      {"llama3_pack", hf("llama3_style") + " --prompt-type llama3 --seq-length 200 --pack --map-keys " + kFullKeys},
      {"qwen_neat",
       hf("qwen2_style") + " --prompt-type qwen --seq-length 100 --pack --neat-pack --map-keys " + kFullKeys},
      {"llama3_neat", hf("llama3_style") + " --prompt-type llama3 --seq-length 140 --pack --neat-pack --append-eod "
                                           "--map-keys " + kFullKeys},
      {"sharegpt_qwen", hf("qwen2_style") + " --prompt-type qwen --seq-length 120 --map-keys '{\"system\":\"system\"}'",
       "sharegpt.jsonl"},
      {"sharegpt_llama3", hf("llama3_style") + " --prompt-type llama3 --seq-length 200", "sharegpt.jsonl"},
  };
  for (const SftRun& run : runs) {
    SCOPED_TRACE(run.name);
    TempDir dir;
    const std::string handler = std::string(run.input) == "sharegpt.jsonl" ? "SharegptStyleInstructionHandler"
                                                                          : "AlpacaStyleInstructionHandler";
    auto r = run_gale("preprocess --handler-name " + handler + " --input " + kRef + "/" + run.input +
                          " --output-prefix " + dir.file("out") + " " + run.flags,
                      dir.path());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    for (const char* key : {"input_ids", "attention_mask", "labels"}) {
      for (const char* ext : {".bin", ".idx"}) {
        std::string ours = read_file(dir.file(std::string("out_packed_") + key + "_document") + ext);
        std::string ref = read_file(kRef + "/" + run.name + "_packed_" + key + "_document" + ext);
        ASSERT_FALSE(ref.empty());
        EXPECT_TRUE(ours == ref) << key << ext << " differs (" << ours.size() << " vs " << ref.size() << " bytes)";
      }
    }
  }
}

TEST(SftPreprocess, ReportsDroppedSamples) {
  TempDir dir;
  auto r = run_gale("preprocess --handler-name AlpacaStyleInstructionHandler --input " + kRef +
                        "/alpaca.jsonl --output-prefix " + dir.file("out") + " " + hf("qwen2_style") +
                        " --prompt-type qwen --seq-length 120",
                    dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("9 records: 6 samples written"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1 dropped with 120 or more tokens (--seq-length), 2 without a response skipped"),
            std::string::npos)
      << r.out;
}

// --neat-pack cuts what --pack drops: the long story (one record) is cut to fit seq_length - 1
// ids, and the cut is reported.
TEST(SftPreprocess, NeatPackCutsLongSamplesInsteadOfDroppingThem) {
  TempDir dir;
  auto r = run_gale("preprocess --handler-name AlpacaStyleInstructionHandler --input " + kRef +
                        "/alpaca.jsonl --output-prefix " + dir.file("out") + " " + hf("qwen2_style") +
                        " --prompt-type qwen --seq-length 100 --pack --neat-pack",
                    dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("0 dropped with 100 or more tokens"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--neat-pack: 1 samples cut to fit 99 tokens"), std::string::npos) << r.out;
}

// ShareGPT records MindSpeed-LLM skips (first message not from the user, an odd count, no
// messages) write no document and are counted; tool turns and tool descriptions are refused.
TEST(SftPreprocess, ShareGptSkipsBrokenConversationsAndRefusesToolTurns) {
  TempDir dir;
  auto r = run_gale("preprocess --handler-name SharegptStyleInstructionHandler --input " + kRef +
                        "/sharegpt.jsonl --output-prefix " + dir.file("out") + " " + hf("qwen2_style") +
                        " --prompt-type qwen --seq-length 120",
                    dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("8 records: 4 samples written"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1 dropped with 120 or more tokens (--seq-length), 3 without a response skipped"),
            std::string::npos)
      << r.out;
  std::ofstream(dir.file("tool.jsonl"))
      << R"({"conversations": [{"from": "human", "value": "weather?"}, {"from": "function_call", "value": "{}"}]})"
      << "\n";
  r = run_gale("preprocess --handler-name SharegptStyleInstructionHandler --input " + dir.file("tool.jsonl") +
                   " --output-prefix " + dir.file("t") + " " + hf("qwen2_style") + " --prompt-type qwen --seq-length 64",
               dir.path());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("tool.jsonl:1: role 'function_call': observation and function messages are not supported yet"),
            std::string::npos)
      << r.err;
  std::ofstream(dir.file("tools.jsonl"))
      << R"({"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}], "tools": "[{}]"})"
      << "\n";
  r = run_gale("preprocess --handler-name SharegptStyleInstructionHandler --input " + dir.file("tools.jsonl") +
                   " --output-prefix " + dir.file("u") + " " + hf("qwen2_style") +
                   " --prompt-type qwen --seq-length 64 --map-keys '{\"tools\":\"tools\"}'",
               dir.path());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("key 'tools': tool descriptions are not supported yet"), std::string::npos) << r.err;
  r = run_gale("preprocess --handler-name SharegptStyleInstructionHandler --input " + dir.file("tools.jsonl") +
                   " --output-prefix " + dir.file("v") + " " + hf("qwen2_style") +
                   " --prompt-type qwen --seq-length 64 --map-keys '{\"prompt\":\"x\"}'",
               dir.path());
  EXPECT_NE(r.err.find("--map-keys: expected keys among messages, system, tools, tags, found 'prompt'"),
            std::string::npos)
      << r.err;
}

class SftPreprocessErrors : public ::testing::Test {
 protected:
  TempDir dir_;
  testing::CommandResult run(const std::string& jsonl, const std::string& flags) {
    std::ofstream(dir_.file("in.jsonl")) << jsonl;
    return run_gale("preprocess --handler-name AlpacaStyleInstructionHandler --input " + dir_.file("in.jsonl") +
                        " --output-prefix " + dir_.file("out") + " " + flags,
                    dir_.path());
  }
  void expect_fails_with(const testing::CommandResult& r, const std::string& fragment) {
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find(fragment), std::string::npos) << r.err;
    size_t line = r.err.rfind("gale preprocess: ");
    ASSERT_NE(line, std::string::npos) << r.err;
    EXPECT_EQ(r.err.find('\n', line), r.err.size() - 1) << "one line: " << r.err;
    EXPECT_FALSE(std::filesystem::exists(dir_.file("out_packed_input_ids_document.idx"))) << "no output on error";
  }
  const std::string qwen_ = hf("qwen2_style") + " --prompt-type qwen --seq-length 64";
};

TEST_F(SftPreprocessErrors, MissingKeyNamesFileLineAndKey) {
  auto r = run("{\"instruction\": \"a\", \"output\": \"b\"}\n{\"instruction\": \"a\"}\n", qwen_);
  expect_fails_with(r, "in.jsonl:2: missing key 'output'");
}

TEST_F(SftPreprocessErrors, MappedKeyMissing) {
  auto r = run("{\"instruction\": \"a\", \"output\": \"b\"}\n",
               qwen_ + " --map-keys '{\"prompt\":\"question\",\"response\":\"output\"}'");
  expect_fails_with(r, "in.jsonl:1: missing key 'question'");
}

TEST_F(SftPreprocessErrors, WrongTypes) {
  expect_fails_with(run("{\"instruction\": 3, \"output\": \"b\"}\n", qwen_),
                    "in.jsonl:1: key 'instruction': expected a string, found number");
  expect_fails_with(run("[1]\n", qwen_), "in.jsonl:1: expected a JSON object");
  expect_fails_with(run("{\"instruction\": \"a\", \"output\": \"b\", \"history\": [[\"x\"]]}\n",
                        qwen_ + " --map-keys '{\"history\":\"history\"}'"),
                    "in.jsonl:1: key 'history': expected a list of [user, assistant] pairs of strings");
}

TEST_F(SftPreprocessErrors, UnknownTemplateHandlerAndFlags) {
  const std::string ok = "{\"instruction\": \"a\", \"output\": \"b\"}\n";
  expect_fails_with(run(ok, hf("qwen2_style") + " --prompt-type chatgpt --seq-length 64"),
                    "--prompt-type: expected one of empty, qwen, llama3, alpaca, found 'chatgpt'");
  expect_fails_with(run(ok, hf("llama3_style") + " --prompt-type qwen --seq-length 64"),
                    "the tokenizer has no token '<|im_end|>'");
  expect_fails_with(run(ok, qwen_ + " --neat-pack"), "--neat-pack requires --pack");
  expect_fails_with(run(ok, hf("qwen2_style") + " --prompt-type qwen"), "--seq-length: expected a positive integer");
  expect_fails_with(run(ok, qwen_ + " --map-keys '{\"answer\":\"x\"}'"), "--map-keys: expected keys among");
  std::ofstream(dir_.file("in.jsonl")) << ok;
  auto r = run_gale("preprocess --handler-name SharegptStylePairwiseHandler --input " + dir_.file("in.jsonl") +
                        " --output-prefix " + dir_.file("out") + " " + qwen_,
                    dir_.path());
  expect_fails_with(r, "--handler-name SharegptStylePairwiseHandler: not supported");
}

}  // namespace
}  // namespace gale
