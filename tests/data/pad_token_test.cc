// choose_pad_token: Megatron-LM main's pad id for GPT datasets, with and without
// --allow-ambiguous-pad-tokens, against tests/data/reference/samples/main_data_flags.json (written
// by tools/reference/megatron_main_data_flags_reference.py with Megatron-LM main's GPTDataset).
#include "data/pad_token.h"

#include <gtest/gtest.h>

#include "data/data_test_util.h"
#include "data/sample.h"

namespace gale {
namespace {

using json = nlohmann::json;

const json& golden_pad() {
  static json j = testing::load_json(testing::reference_path("samples/main_data_flags.json"))["pad"];
  return j;
}

constexpr int32_t kEod = 50256;

TEST(PadToken, UniquePadIsKeptWithoutWarning) {
  const int32_t specials[] = {kEod};
  for (bool allow : {false, true}) {
    PadTokenChoice c = choose_pad_token(7, specials, allow);
    EXPECT_EQ(c.pad, 7);
    EXPECT_TRUE(c.warning.empty()) << c.warning;
  }
}

TEST(PadToken, NoPadStaysMinusOne) {
  const int32_t specials[] = {kEod};
  PadTokenChoice c = choose_pad_token(-1, specials, true);
  EXPECT_EQ(c.pad, -1);
  EXPECT_TRUE(c.warning.empty());
}

// Megatron's pad id and its warning when the pad equals the eod.
TEST(PadToken, CollisionMatchesMegatron) {
  const int32_t specials[] = {kEod};
  for (const char* mode : {"default", "allow"}) {
    SCOPED_TRACE(mode);
    const json& g = golden_pad()[mode];
    PadTokenChoice c = choose_pad_token(kEod, specials, std::string(mode) == "allow");
    EXPECT_EQ(c.pad, g["pad_token_id"].get<int32_t>());
    ASSERT_EQ(g["warnings"].size(), 1u);
    EXPECT_EQ(c.warning, g["warnings"][0].get<std::string>());
  }
}

// The sample Megatron recorded under each mode, assembled from its text with the chosen pad: with
// the ambiguous pad kept, the end-of-document label is masked and replaced by 0.
TEST(PadToken, SampleLabelsAndLossMaskMatchMegatron) {
  const int32_t specials[] = {kEod};
  const json& plain = golden_pad()["default"];
  std::vector<int32_t> text = plain["tokens"].get<std::vector<int32_t>>();
  text.push_back(plain["labels"].back().get<int32_t>());  // the labels are the text shifted by one
  for (const char* mode : {"default", "allow"}) {
    SCOPED_TRACE(mode);
    const json& g = golden_pad()[mode];
    SampleOptions o;
    o.eod = kEod;
    o.pad = choose_pad_token(kEod, specials, std::string(mode) == "allow").pad;
    TrainingSample s;
    assemble_sample(text, 1, o, &s);
    EXPECT_EQ(s.tokens, g["tokens"].get<std::vector<int32_t>>());
    EXPECT_EQ(s.labels, g["labels"].get<std::vector<int32_t>>());
    std::vector<int> loss(s.loss_mask.begin(), s.loss_mask.end());
    EXPECT_EQ(loss, g["loss_mask"].get<std::vector<int>>());
  }
  // The golden sample does hold an end-of-document label (else the test would prove nothing).
  const auto labels = plain["labels"].get<std::vector<int32_t>>();
  EXPECT_NE(std::find(labels.begin(), labels.end(), kEod), labels.end());
}

}  // namespace
}  // namespace gale
