// Megatron's --pipeline-model-parallel-layout (train/pipeline_layout.h): the grammar (repeats,
// groups, commas, empty stages), Megatron's stage order (stage k = virtual stage k / PP of rank
// k mod PP) and the placement rules, each refusal one line naming the flag.
#include "train/pipeline_layout.h"

#include <gtest/gtest.h>

namespace gale {
namespace {

using Layers = std::vector<std::vector<int64_t>>;

std::string error_of(const std::string& text, int64_t pp, int64_t layers, int64_t mtp = 0) {
  StatusOr<Layers> r = pipeline_layout_layers(text, pp, layers, mtp);
  if (r.ok()) return "ok";
  EXPECT_EQ(r.status().message().find('\n'), std::string::npos) << r.status().message();
  return r.status().message();
}

TEST(PipelineLayout, ParsesRepeatsGroupsAndEmptyStages) {
  StatusOr<std::vector<std::string>> s = parse_pipeline_layout("Et*3|(tt|)*2,m|L");
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(*s, (std::vector<std::string>{"Ettt", "tt", "tt", "m", "L"}));
  s = parse_pipeline_layout("E||t, t|(t*2)*2L");
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(*s, (std::vector<std::string>{"E", "", "tt", "ttttL"}));
  s = parse_pipeline_layout("(|ab)*0");  // a zero repeat is nothing; the symbols are checked after unrolling
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(*s, (std::vector<std::string>{""}));
}

// Megatron's documented example, DeepSeek-V3's 61 layers and one MTP layer at PP 16, VPP 2: parsed
// into its 32 stages, but refused, as its MTP layer sits in rank 14's second stage, not beside the
// loss; with the MTP layer moved beside the loss it places as Megatron's table says.
TEST(PipelineLayout, MegatronsDeepSeekExample) {
  StatusOr<std::vector<std::string>> s = parse_pipeline_layout("Et*3|(tt|)*29,m|L");
  ASSERT_TRUE(s.ok()) << s.status().message();
  ASSERT_EQ(s->size(), 32u);
  EXPECT_EQ((*s)[0], "Ettt");
  for (size_t k = 1; k < 30; ++k) EXPECT_EQ((*s)[k], "tt") << k;
  EXPECT_EQ((*s)[30], "m");
  EXPECT_EQ((*s)[31], "L");
  EXPECT_NE(error_of("Et*3|(tt|)*29,m|L", 16, 61, 1).find("standalone MTP"), std::string::npos);
  StatusOr<Layers> r = pipeline_layout_layers("Et|(tt|)*29,tt|mL", 16, 61, 1);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->size(), 16u);
  EXPECT_EQ((*r)[0], (std::vector<int64_t>{1, 2}));   // embedding + 1 decoder | 2 decoders
  EXPECT_EQ((*r)[13], (std::vector<int64_t>{2, 2}));
  EXPECT_EQ((*r)[14], (std::vector<int64_t>{2, 2}));
  EXPECT_EQ((*r)[15], (std::vector<int64_t>{2, 0}));  // its second stage: the MTP layer and the loss
}

TEST(PipelineLayout, StageOrderIsVirtualStageMajor) {
  // PP 2, VPP 2: stages (rank 0, v0), (rank 1, v0), (rank 0, v1), (rank 1, v1).
  StatusOr<Layers> r = pipeline_layout_layers("Et|ttt||ttL", 2, 6, 0);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(*r, (Layers{{1, 0}, {3, 2}}));
  r = pipeline_layout_layers("Ettt,t|ttL", 2, 6, 0);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(*r, (Layers{{4}, {2}}));
  r = pipeline_layout_layers("Et|tmmL", 2, 2, 2);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(*r, (Layers{{1}, {1}}));
}

TEST(PipelineLayout, Refusals) {
  const std::string f = "--pipeline-model-parallel-layout ";
  EXPECT_EQ(error_of("Et|tx|L", 3, 2),
            f + "'Et|tx|L': expected the layer symbols E (embedding), t (decoder layer), m (MTP layer), L (loss) and "
                "'|' between stages, found 'x'");
  EXPECT_EQ(error_of("Et|t|L", 2, 2), f + "'Et|t|L': expected a number of stages divisible by "
                                          "--pipeline-model-parallel-size 2, found 3");
  EXPECT_EQ(error_of("tE|tL", 2, 2), f + "'tE|tL': expected E exactly once, as the first layer of the first stage, "
                                         "found 1 E elsewhere");
  EXPECT_EQ(error_of("Et|EtL", 2, 2), f + "'Et|EtL': expected E exactly once, as the first layer of the first stage, "
                                          "found 2 E");
  EXPECT_EQ(error_of("Et|Lt", 2, 2), f + "'Et|Lt': expected L exactly once, as the last layer of the last stage, "
                                         "found 1 L elsewhere");
  EXPECT_EQ(error_of("Et|tL", 2, 3), f + "'Et|tL': expected --num-layers 3 decoder layers (t), found 2");
  EXPECT_EQ(error_of("Et|tmL", 2, 2), f + "'Et|tmL': expected 0 MTP layers (m, --mtp-num-layers), found 1");
  EXPECT_EQ(error_of("Etm|tL", 2, 2, 1), f + "'Etm|tL': expected every MTP layer (m) after every decoder layer (t)");
  EXPECT_EQ(error_of("Et|tm|L|", 4, 2, 1), f + "'Et|tm|L|': expected L exactly once, as the last layer of the last "
                                               "stage, found 1 L elsewhere");
  EXPECT_EQ(error_of("Et|tt|m|L", 2, 3, 1),
            f + "'Et|tt|m|L': MTP layers on a stage without the loss (Megatron's standalone MTP) are not supported "
                "yet; Gale runs them beside the loss: put every m in the last stage");
  EXPECT_EQ(error_of("E(tt|L", 1, 2), f + "'E(tt|L': unmatched '(' at position 1");
  EXPECT_EQ(error_of("Ett)|L", 1, 2), f + "'Ett)|L': unmatched ')' at position 3");
  EXPECT_EQ(error_of("E(t|)|L", 1, 1), f + "'E(t|)|L': expected '*n' after the group '(t|)'");
  EXPECT_EQ(error_of("Et*|L", 1, 1), f + "'Et*|L': expected a count after '*' at position 3, found '|L'");
  EXPECT_EQ(error_of("*3", 1, 1), f + "'*3': '*' at position 0 repeats nothing");
  EXPECT_EQ(error_of("Et*99999999L", 1, 1), f + "'Et*99999999L': expected a count after '*' at position 3, found "
                                               "'99999999'");
  EXPECT_NE(error_of("E(t*9999)*9999L", 1, 1).find("': the repeats unroll to more than 1048576 symbols"),
            std::string::npos);
}

}  // namespace
}  // namespace gale
