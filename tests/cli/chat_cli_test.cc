// `gale generate --task chat` (MindSpeed-LLM's chat task) on standard input, `--stream`, and the
// stop-token flags, on a small checkpoint with a Qwen-style Hugging Face tokenizer.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>

#include "cli/cli_test_util.h"
#include "data/data_test_util.h"

namespace gale {
namespace {

const std::string kQwen = std::string(GALE_TEST_DATA_DIR) + "/tokenizers/qwen2_style";
const std::string kModel = "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 "
                           "--max-position-embeddings 128 --tokenizer-type HuggingFaceTokenizer --tokenizer-model " +
                           kQwen;

class ChatCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    const std::string sft = std::string(GALE_TEST_DATA_DIR) + "/reference/sft/alpaca.jsonl";
    trained_ = new testing::CommandResult(testing::run_gale(
        "preprocess --handler-name AlpacaStyleInstructionHandler --input " + sft + " --output-prefix " +
            dir_->file("sft") + " --tokenizer-type HuggingFaceTokenizer --tokenizer-model " + kQwen +
            " --prompt-type qwen --seq-length 64",
        dir_->path()));
    if (trained_->exit_code != 0) return;
    *trained_ = testing::run_gale("pretrain " + kModel + " --micro-batch-size 2 --global-batch-size 2 --train-iters 30 "
                                  "--lr 1e-3 --is-instruction-dataset --data-path " + dir_->file("sft") +
                                  " --split 100,0,0 --eval-iters 0 --num-threads 1 --save " + dir_->file("ckpt") +
                                  " --save-interval 30",
                                  dir_->path());
  }
  static void TearDownTestSuite() {
    delete trained_;
    delete dir_;
  }
  static testing::CommandResult generate(const std::string& flags, const std::string& input = "") {
    std::string redirect;
    if (!input.empty()) {
      std::ofstream(dir_->file("input.txt")) << input;
      redirect = " <" + dir_->file("input.txt");
    }
    return testing::run_gale("generate " + kModel + " --load " + dir_->file("ckpt") + " " + flags + redirect,
                             dir_->path());
  }
  static testing::TempDir* dir_;
  static testing::CommandResult* trained_;
};

testing::TempDir* ChatCli::dir_ = nullptr;
testing::CommandResult* ChatCli::trained_ = nullptr;

std::vector<std::string> answers(const std::string& out) {
  std::vector<std::string> r;
  std::regex re("\nGale:\n([^\n]*)\n");
  for (std::sregex_iterator it(out.begin(), out.end(), re), end; it != end; ++it) r.push_back((*it)[1]);
  return r;
}

// Sampled answers (every answer draws with the same --seed): the same question after `clear` gets
// the same answer as the first time; blank lines are skipped and `q` ends the session.
TEST_F(ChatCli, AnswersEachLineAndClearForgetsTheHistory) {
  ASSERT_EQ(trained_->exit_code, 0) << trained_->err;
  testing::CommandResult r = generate("--task chat --prompt-type qwen --max-new-tokens 6 --seed 3",
                                      "Hello there\n\nHow are you?\nclear\nHello there\nq\nnot read\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<std::string> a = answers(r.out);
  ASSERT_EQ(a.size(), 3u) << r.out;
  EXPECT_FALSE(a[0].empty()) << r.out;
  EXPECT_EQ(a[0], a[2]) << r.out;
  EXPECT_EQ(r.out.find("not read"), std::string::npos);
  // The end of the input ends the session too; --stream prints the same answer.
  testing::CommandResult streamed =
      generate("--task chat --prompt-type qwen --max-new-tokens 6 --seed 3 --stream", "Hello there\n");
  ASSERT_EQ(streamed.exit_code, 0) << streamed.err;
  ASSERT_EQ(answers(streamed.out).size(), 1u) << streamed.out;
  EXPECT_EQ(answers(streamed.out)[0], a[0]);
}

// The template's end token ends an answer: it never shows in the text.
TEST_F(ChatCli, TheTemplateEndStopsTheAnswer) {
  ASSERT_EQ(trained_->exit_code, 0) << trained_->err;
  testing::CommandResult r =
      generate("--task chat --prompt-type qwen --max-new-tokens 24 --seed 5", "Hi\nName a colour.\nGreet me.\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_EQ(answers(r.out).size(), 3u) << r.out;
  EXPECT_EQ(r.out.find("<|im_end|>"), std::string::npos) << r.out;
}

TEST_F(ChatCli, StreamPrintsWhatThePlainRunPrints) {
  ASSERT_EQ(trained_->exit_code, 0) << trained_->err;
  testing::CommandResult plain = generate("--prompt 'Once upon a time' --temperature 0 --max-new-tokens 8");
  testing::CommandResult streamed = generate("--prompt 'Once upon a time' --temperature 0 --max-new-tokens 8 --stream");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  ASSERT_EQ(streamed.exit_code, 0) << streamed.err;
  std::string expected = plain.out;  // --stream leaves out the U+FFFD of a cut UTF-8 sequence
  for (size_t at; (at = expected.find("\xEF\xBF\xBD")) != std::string::npos;) expected.erase(at, 3);
  EXPECT_EQ(streamed.out, expected);
}

TEST_F(ChatCli, FlagErrorsAreOneLine) {
  ASSERT_EQ(trained_->exit_code, 0) << trained_->err;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--task greedy", "gale generate: error: --task: expected chat, found 'greedy'"},
      {"--task chat --prompt x", "gale generate: error: --prompt with --task chat: the chat reads its prompts from "
                                 "standard input\n"},
      {"--prompt-type qwen --prompt x", "gale generate: error: --prompt-type needs --task chat\n"},
      {"--task chat --prompt-type nope", "gale generate: error: --prompt-type: "},
      {"--prompt x --add-eos-token '<|nope|>'", "gale generate: error: --add-eos-token: the tokenizer has no token "
                                                "'<|nope|>'\n"},
  };
  for (const auto& [flags, message] : cases) {
    testing::CommandResult r = generate(flags, "q\n");
    EXPECT_EQ(r.exit_code, 2) << flags << "\n" << r.err;
    EXPECT_EQ(r.err.rfind(message, 0), 0u) << flags << "\n" << r.err;
  }
}

}  // namespace
}  // namespace gale
