// BoolQ and HellaSwag records as multiple-choice items: prompts, lm-evaluation-harness's HellaSwag
// cleaning (expected strings from its Python code), labels, field errors, per-character argmax.
#include "train/evaluate_choice_tasks.h"

#include <gtest/gtest.h>

namespace gale {
namespace {

TEST(EvaluateChoiceTasks, BoolqPromptAndAnswer) {
  StatusOr<ChoiceItem> item =
      parse_choice_item("boolq", R"({"question": "is the sky blue", "passage": "The sky is blue.", "answer": true, "title": "Sky"})");
  ASSERT_TRUE(item.ok()) << item.status().message();
  EXPECT_EQ(item->context, "The sky is blue.\nQuestion: is the sky blue?\nAnswer:");
  EXPECT_EQ(item->continuations, (std::vector<std::string>{" no", " yes"}));
  EXPECT_EQ(item->answer, 1);
  item = parse_choice_item("boolq", R"({"question": "q", "passage": "p", "answer": false})");
  ASSERT_TRUE(item.ok());
  EXPECT_EQ(item->answer, 0);
}

TEST(EvaluateChoiceTasks, HellaswagPreprocessAsTheHarness) {
  EXPECT_EQ(hellaswag_preprocess("  Removing ice from car: [header] Then, the man writes over the snow [title] Covering  "
                                 "the windshield [step] Use a scraper.  "),
            "Removing ice from car: Then, the man writes over the snow. Covering the windshield Use a scraper.");
  EXPECT_EQ(hellaswag_preprocess("a [b c]   d [unclosed"), "a  d [unclosed");
  EXPECT_EQ(hellaswag_preprocess("Finance and Business: [title] How to  pay"), "Finance and Business:. How to pay");
}

TEST(EvaluateChoiceTasks, HellaswagContextEndingsAndLabel) {
  StatusOr<ChoiceItem> item = parse_choice_item(
      "hellaswag", R"({"activity_label": "Baking cookies", "ctx_a": "A woman mixes dough.", "ctx_b": "she",)"
                   R"( "endings": ["bakes it.", "sings [title] loudly.", "x", "y"], "label": "1"})");
  ASSERT_TRUE(item.ok()) << item.status().message();
  EXPECT_EQ(item->context, "Baking cookies: A woman mixes dough. She");
  EXPECT_EQ(item->continuations, (std::vector<std::string>{" bakes it.", " sings. loudly.", " x", " y"}));
  EXPECT_EQ(item->answer, 1);
  item = parse_choice_item("hellaswag", R"({"activity_label": "A", "ctx": "B c", "endings": ["d", "e"], "label": 0})");
  ASSERT_TRUE(item.ok()) << item.status().message();
  EXPECT_EQ(item->context, "A: B c");
  EXPECT_EQ(item->answer, 0);
}

TEST(EvaluateChoiceTasks, FieldErrorsNameTheField) {
  EXPECT_EQ(parse_choice_item("boolq", R"({"question": "q", "passage": "p"})").status().message(),
            "expected a boolean field \"answer\"");
  EXPECT_EQ(parse_choice_item("boolq", R"({"question": 3, "passage": "p", "answer": true})").status().message(),
            "expected a string field \"question\"");
  EXPECT_EQ(parse_choice_item("hellaswag", R"({"activity_label": "A", "ctx": "B", "endings": ["d", "e"], "label": 2})")
                .status()
                .message(),
            "expected \"label\" to index \"endings\" (0 to 1)");
  EXPECT_EQ(parse_choice_item("hellaswag", "[1, 2]").status().message(), "expected a JSON object");
}

TEST(EvaluateChoiceTasks, PerCharacterArgmaxCountsCodePoints) {
  // −3 over " ab" (3) beats −6 over " abcd" (5) per character; "é" is one character of two bytes
  // (per byte " été" would win with −4/6).
  EXPECT_EQ(argmax_per_character({-3.0, -6.0}, {" ab", " abcd"}), 0);
  EXPECT_EQ(utf8_length(" \xC3\xA9t\xC3\xA9"), 4);
  EXPECT_EQ(argmax_per_character({-4.0, -5.2}, {" \xC3\xA9t\xC3\xA9", " abcdef"}), 1);  // −1.0 vs −0.74
}

}  // namespace
}  // namespace gale
