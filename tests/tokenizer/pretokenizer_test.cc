// Pre-tokenizer matchers on hand-checked cases of each regex rule (the golden ids cover the rest).
#include "tokenizer/pretokenizer.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tokenizer/split_pieces.h"

namespace gale {
namespace {

using V = std::vector<std::string>;

TEST(Gpt2Pattern, ContractionsAreCaseSensitive) {
  EXPECT_EQ(split(SplitPattern::kGpt2, "I'm you're IT'S"), (V{"I", "'m", " you", "'re", " IT", "'", "S"}));
}

TEST(Gpt2Pattern, SpaceAttachesToFollowingRun) {
  EXPECT_EQ(split(SplitPattern::kGpt2, "a 12 ?! b"), (V{"a", " 12", " ?!", " b"}));
}

TEST(Gpt2Pattern, WhitespaceRunLeavesLastSpaceForNextWord) {
  EXPECT_EQ(split(SplitPattern::kGpt2, "a   b"), (V{"a", "  ", " b"}));
  EXPECT_EQ(split(SplitPattern::kGpt2, "a\n\nb"), (V{"a", "\n", "\n", "b"}));
  EXPECT_EQ(split(SplitPattern::kGpt2, "a  "), (V{"a", "  "}));  // trailing run stays whole
  EXPECT_EQ(split(SplitPattern::kGpt2, "\tx"), (V{"\t", "x"}));
}

TEST(Gpt2Pattern, UnicodeClasses) {
  // U+00E9 is a letter, U+0663 (Arabic-Indic three) a number, U+3000 a space, U+1F980 other.
  EXPECT_EQ(split(SplitPattern::kGpt2, "caf\xC3\xA9 \xD9\xA3\xE3\x80\x80\xF0\x9F\xA6\x80"),
            (V{"caf\xC3\xA9", " \xD9\xA3", "\xE3\x80\x80", "\xF0\x9F\xA6\x80"}));
}

TEST(Llama3Pattern, Rules) {
  EXPECT_EQ(split(SplitPattern::kLlama3, "I'M ok"), (V{"I", "'M", " ok"}));          // case-insensitive contraction
  EXPECT_EQ(split(SplitPattern::kLlama3, "(word) x"), (V{"(word", ")", " x"}));      // one non-letter joins letters
  EXPECT_EQ(split(SplitPattern::kLlama3, "1234567"), (V{"123", "456", "7"}));        // \p{N}{1,3}
  EXPECT_EQ(split(SplitPattern::kLlama3, "a.\n\nb"), (V{"a", ".\n\n", "b"}));        // punctuation takes newlines
  EXPECT_EQ(split(SplitPattern::kLlama3, "a \n  \n b"), (V{"a", " \n  \n", " b"}));  // \s*[\r\n]+
  EXPECT_EQ(split(SplitPattern::kLlama3, "\tword"), (V{"\tword"}));
}

TEST(Qwen2Pattern, SingleDigits) { EXPECT_EQ(split(SplitPattern::kQwen2, "x2024"), (V{"x", "2", "0", "2", "4"})); }

TEST(SplitPatterns, EmptyTextHasNoPieces) { EXPECT_TRUE(split(SplitPattern::kGpt2, "").empty()); }

TEST(SplitPatterns, RecognizesKnownRegexes) {
  EXPECT_EQ(recognize_split_pattern(R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)"),
            SplitPattern::kGpt2);
  EXPECT_EQ(
      recognize_split_pattern(
          R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"),
      SplitPattern::kQwen2);
  EXPECT_FALSE(recognize_split_pattern(R"(\w+)").has_value());
}

}  // namespace
}  // namespace gale
