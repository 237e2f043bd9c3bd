// GRPO prompt ids (--[no-]rl-skip-bos-token): Megatron main's tokenize_prompt with add_BOS =
// !rl_skip_bos_token and a tokenizer BOS (text_generation_controller.py, chat_completions.py): the
// text's leading BOS ids dropped, one BOS put in front by default; and Tokenizer::bos per class.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tokenizer/gpt2_tokenizer.h"
#include "tokenizer/hf_tokenizer.h"
#include "train/grpo_rollouts.h"

namespace gale {
namespace {

std::unique_ptr<Tokenizer> make(const std::string& type, const std::string& model, int64_t vocab_size = -1) {
  TokenizerOptions o;
  o.type = type;
  o.tokenizer_model = model;
  o.vocab_size = vocab_size;
  auto t = build_tokenizer(o);
  EXPECT_TRUE(t.ok()) << t.status().message();
  return t.ok() ? std::move(t).value() : nullptr;
}

std::string data(const std::string& rel) { return std::string(GALE_TEST_DATA_DIR) + "/tokenizers/" + rel; }

std::vector<int32_t> prompt(const Tokenizer& t, const std::string& text, bool skip) {
  std::vector<int32_t> ids{7, 7};  // replaced, not appended to
  const Status st = grpo_prompt_ids(t, text, skip, &ids);
  EXPECT_TRUE(st.ok()) << st.message();
  return ids;
}

std::vector<int32_t> encode(const Tokenizer& t, const std::string& text) {
  std::vector<int32_t> ids;
  EXPECT_TRUE(t.encode(text, &ids).ok());
  return ids;
}

// Llama2Tokenizer's own encoding starts with BOS: one BOS by default (not two), none when skipped.
TEST(GrpoPrompt, LeadingBosDroppedThenOnePrependedUnlessSkipped) {
  auto t = make("Llama2Tokenizer", data("spm_austen.model"));
  ASSERT_NE(t, nullptr);
  const int32_t bos = t->bos();
  ASSERT_GE(bos, 0);
  const std::vector<int32_t> text = encode(*t, "It is a truth universally acknowledged");
  ASSERT_GE(text.size(), 3u);
  ASSERT_EQ(text[0], bos);
  const std::vector<int32_t> body(text.begin() + 1, text.end());
  std::vector<int32_t> want{bos};
  want.insert(want.end(), body.begin(), body.end());
  EXPECT_EQ(prompt(*t, "It is a truth universally acknowledged", false), want);
  EXPECT_EQ(prompt(*t, "It is a truth universally acknowledged", true), body);
}

// A tokenizer whose encoding has no BOS gets one in front by default (HF bos_token).
TEST(GrpoPrompt, HuggingFaceBosTokenPrependedByDefault) {
  auto t = make("HuggingFaceTokenizer", data("llama3_style"));
  ASSERT_NE(t, nullptr);
  std::vector<int32_t> plain;
  ASSERT_TRUE(dynamic_cast<const HuggingFaceTokenizer&>(*t).encode_plain("hello world", &plain).ok());
  const int32_t bos = t->bos();
  ASSERT_GE(bos, 0);
  ASSERT_FALSE(plain.empty());
  ASSERT_NE(plain[0], bos);
  std::vector<int32_t> want{bos};
  want.insert(want.end(), plain.begin(), plain.end());
  EXPECT_EQ(prompt(*t, "hello world", false), want);
  EXPECT_EQ(prompt(*t, "hello world", true), plain);
}

// No BOS (qwen2_style names none; NullTokenizer has none): the text's ids either way.
TEST(GrpoPrompt, TokenizersWithoutBosKeepTheTextIds) {
  auto qwen = make("HuggingFaceTokenizer", data("qwen2_style"));
  ASSERT_NE(qwen, nullptr);
  EXPECT_EQ(qwen->bos(), -1);
  EXPECT_EQ(prompt(*qwen, "hello world", false), encode(*qwen, "hello world"));
  auto null = make("NullTokenizer", "", 100);
  ASSERT_NE(null, nullptr);
  EXPECT_EQ(null->bos(), -1);
  EXPECT_EQ(prompt(*null, "3 1 4", false), (std::vector<int32_t>{3, 1, 4}));
  EXPECT_EQ(prompt(*null, "3 1 4", true), (std::vector<int32_t>{3, 1, 4}));
}

// GPT2BPETokenizer: Megatron main wraps transformers' GPT-2 tokenizer, whose bos_token is
// <|endoftext|>.
TEST(GrpoPrompt, Gpt2BosIsEndOfText) {
  const std::string vocab = R"({"a": 0, "b": 1, "ab": 2, "<|endoftext|>": 3})";
  auto t = Gpt2BpeTokenizer::parse(vocab, "#version: 0.2\na b\n", "vocab.json", "merges.txt");
  ASSERT_TRUE(t.ok()) << t.status().message();
  const Tokenizer& g = *t.value();
  EXPECT_EQ(g.bos(), 3);
  EXPECT_EQ(g.bos(), g.eod());
  EXPECT_EQ(prompt(g, "ab", false), (std::vector<int32_t>{3, 2}));
  EXPECT_EQ(prompt(g, "ab", true), (std::vector<int32_t>{2}));
}

}  // namespace
}  // namespace gale
