// Chat prompts: the qwen template's text around the kept history, the history limit, and the plain
// concatenation without a template.
#include "train/chat.h"

#include <gtest/gtest.h>

#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace gale {
namespace {

std::unique_ptr<Tokenizer> qwen_tokenizer() {
  TokenizerOptions o;
  o.type = "HuggingFaceTokenizer";
  o.tokenizer_model = std::string(GALE_TEST_DATA_DIR) + "/tokenizers/qwen2_style";
  StatusOr<std::unique_ptr<Tokenizer>> t = build_tokenizer(o);
  EXPECT_TRUE(t.ok()) << t.status().message();
  return std::move(t.value());
}

ChatSession qwen_session(const Tokenizer& tok, int64_t history_turns) {
  const auto* hf = dynamic_cast<const HuggingFaceTokenizer*>(&tok);
  ChatSession s;
  s.use_template = true;
  s.chat_template = find_chat_template("qwen").value();
  s.tokenizer.encode = [hf](std::string_view text, std::vector<int32_t>* ids) { return hf->encode_plain(text, ids); };
  s.tokenizer.bos = hf->bos_token_id();
  s.tokenizer.eos = hf->token_id("<|im_end|>");
  s.history_turns = history_turns;
  return s;
}

std::string decoded(const Tokenizer& tok, const std::vector<int32_t>& ids) { return tok.decode(ids).value(); }

TEST(Chat, TemplatePromptEndsWhereTheAnswerStarts) {
  auto tok = qwen_tokenizer();
  ChatSession s = qwen_session(*tok, 3);
  EXPECT_EQ(decoded(*tok, chat_prompt(s, "Hi there").value()),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n");
  chat_remember(s, "Hi there", "Hello!");
  EXPECT_EQ(decoded(*tok, chat_prompt(s, "And now?").value()),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
            "<|im_start|>user\nAnd now?<|im_end|>\n<|im_start|>assistant\n");
}

TEST(Chat, KeepsTheLastHistoryTurns) {
  auto tok = qwen_tokenizer();
  ChatSession s = qwen_session(*tok, 1);
  chat_remember(s, "one", "1");
  chat_remember(s, "two", "2");
  ASSERT_EQ(s.history.size(), 2u);
  EXPECT_EQ(s.history[0].content, "two");
  EXPECT_EQ(decoded(*tok, chat_prompt(s, "three").value()),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\ntwo<|im_end|>\n<|im_start|>assistant\n2<|im_end|>\n"
            "<|im_start|>user\nthree<|im_end|>\n<|im_start|>assistant\n");
  ChatSession none = qwen_session(*tok, 0);
  chat_remember(none, "one", "1");
  EXPECT_TRUE(none.history.empty());
}

TEST(Chat, WithoutATemplateThePromptIsThePlainText) {
  auto tok = qwen_tokenizer();
  ChatSession s;
  s.encode_text = [&](std::string_view text, std::vector<int32_t>* ids) { return tok->encode(text, ids); };
  chat_remember(s, "Q1 ", "A1 ");
  std::vector<int32_t> expected;
  ASSERT_TRUE(tok->encode("Q1 A1 Q2", &expected).ok());
  EXPECT_EQ(chat_prompt(s, "Q2").value(), expected);
}

}  // namespace
}  // namespace gale
