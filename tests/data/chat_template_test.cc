// Template._make_pairs truncation and the efficient_eos labels, which the golden datasets cannot
// show (a truncated sample fills the cutoff and is dropped): expected values worked out by hand
// from MindSpeed-LLM's formulas, with a tokenizer that gives one id per byte.
#include "data/chat_template.h"

#include <gtest/gtest.h>

#include "data/instruction_preprocess.h"

namespace gale {
namespace {

TemplateTokenizer bytes_tokenizer() {
  TemplateTokenizer t;
  t.encode = [](std::string_view text, std::vector<int32_t>* ids) {
    for (unsigned char c : text) ids->push_back(c);
    return Status::Ok();
  };
  t.eos = 2;
  return t;
}

std::vector<EncodedTurn> encode(const std::vector<ChatMessage>& m, int64_t cutoff) {
  auto t = find_chat_template("empty");
  EXPECT_TRUE(t.ok());
  std::vector<EncodedTurn> turns;
  EXPECT_TRUE(encode_conversation(*t, bytes_tokenizer(), m, "", cutoff, &turns).ok());
  return turns;
}

TEST(ChatTemplate, TruncationSharesTheCutoffByLength) {
  // source 5, target 100, cutoff 50: target int(50 * 100/105) = 47, source 50 - 47 = 3.
  auto turns = encode({{true, std::string(5, 'a')}, {false, std::string(100, 'b')}}, 50);
  ASSERT_EQ(turns.size(), 1u);
  EXPECT_EQ(turns[0].source.size(), 3u);
  EXPECT_EQ(turns[0].target.size(), 47u);
  // source 100, target 5: target int(50 * 5/105) = 2, source 48.
  turns = encode({{true, std::string(100, 'a')}, {false, std::string(5, 'b')}}, 50);
  EXPECT_EQ(turns[0].source.size(), 48u);
  EXPECT_EQ(turns[0].target.size(), 2u);
  // source 100, target 0: the target keeps at least reserved_label_len = 1 (of 0), source 50 - 0.
  turns = encode({{true, std::string(100, 'a')}, {false, ""}}, 50);
  EXPECT_EQ(turns[0].source.size(), 50u);
  EXPECT_EQ(turns[0].target.size(), 0u);
}

TEST(ChatTemplate, TurnsAfterTheCutoffAreDropped) {
  // Turn 1: 30 + 30 = 60 > 50 -> target int(50 * 0.5) = 25, source 25; total 50: turn 2 dropped.
  auto turns = encode({{true, std::string(30, 'a')},
                       {false, std::string(30, 'b')},
                       {true, "c"},
                       {false, "d"}},
                      50);
  ASSERT_EQ(turns.size(), 1u);
  EXPECT_EQ(turns[0].source.size(), 25u);
  // Fits: 10 + 10, then 1 + 1 -> both kept whole.
  turns = encode({{true, std::string(10, 'a')}, {false, std::string(10, 'b')}, {true, "c"}, {false, "d"}}, 50);
  ASSERT_EQ(turns.size(), 2u);
  EXPECT_EQ(turns[1].source, std::vector<int32_t>{'c'});
  EXPECT_EQ(turns[1].target, std::vector<int32_t>{'d'});
}

TEST(ChatTemplate, EfficientEosLabelsLaterUserTurnsAndEndsWithEos) {
  ChatTemplate t;
  t.name = "custom";
  t.user = {{TemplateSlot::kText, "U{{content}}"}};
  t.assistant = {{TemplateSlot::kText, "{{content}}"}};
  t.efficient_eos = true;
  InstructionConversation c;
  c.messages = {{true, "a"}, {false, "b"}, {true, "c"}, {false, "d"}};
  auto s = tokenize_conversation(t, bytes_tokenizer(), c, 100, -1);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->input_ids, (std::vector<int32_t>{'U', 'a', 'b', 'U', 'c', 'd', 2}));
  EXPECT_EQ(s->labels, (std::vector<int32_t>{-100, -100, 'b', 2, -100, 'd', 2}));
}

TEST(ChatTemplate, UnknownNameListsTheKnownOnes) {
  auto t = find_chat_template("vicuna");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().message(), "--prompt-type: expected one of empty, qwen, llama3, alpaca, found 'vicuna'");
}

}  // namespace
}  // namespace gale
