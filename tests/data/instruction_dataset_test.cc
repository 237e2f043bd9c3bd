// Instruction datasets at training time: the legacy --split and DecoderPackedMTFDataset's shuffled
// order against tools/reference/sft_reference.py (numpy), and the TrainingSample of one document.
#include "data/instruction_dataset.h"

#include <gtest/gtest.h>

#include "data/data_test_util.h"
#include "data/instruction_preprocess.h"

namespace gale {
namespace {

TEST(InstructionDataset, SplitAndOrderMatchTheReference) {
  auto ref = testing::load_json(std::string(GALE_TEST_DATA_DIR) + "/reference/sft/order.json");
  ASSERT_GE(ref.size(), 3u);
  for (auto it = ref.begin(); it != ref.end(); ++it) {
    SCOPED_TRACE(it.key());
    // key: split|documents|seed|num_samples
    std::string key = it.key();
    size_t a = key.find('|'), b = key.find('|', a + 1), c = key.find('|', b + 1);
    std::string split = key.substr(0, a);
    int64_t size = std::stoll(key.substr(a + 1, b - a - 1));
    uint32_t seed = static_cast<uint32_t>(std::stoul(key.substr(b + 1, c - b - 1)));
    int64_t samples = std::stoll(key.substr(c + 1));
    auto bounds = legacy_split_bounds(split, size);
    ASSERT_TRUE(bounds.ok()) << bounds.status().message();
    EXPECT_EQ(std::vector<int64_t>(bounds->begin(), bounds->end()), (*it)["bounds"].get<std::vector<int64_t>>());
    EXPECT_EQ(instruction_sample_order((*bounds)[0], (*bounds)[1], samples, seed, true),
              (*it)["train"].get<std::vector<int64_t>>());
  }
}

TEST(InstructionDataset, UnshuffledOrderIsWholeEpochs) {
  EXPECT_EQ(instruction_sample_order(3, 6, 7, 1, false), (std::vector<int64_t>{3, 4, 5, 3, 4, 5, 3, 4, 5}));
  EXPECT_TRUE(instruction_sample_order(3, 3, 7, 1, true).empty());
}

TEST(InstructionDataset, SplitErrorsNameTheFlag) {
  EXPECT_NE(legacy_split_bounds("a,b", 10).status().message().find("--split"), std::string::npos);
  EXPECT_NE(legacy_split_bounds("0,0,0", 10).status().message().find("--split"), std::string::npos);
}

TEST(InstructionDataset, SampleShiftsLabelsMasksPromptAndPads) {
  // prompt 10 11, answer 12 13, then padding to S = 6 with pad 99.
  const std::vector<int32_t> ids = {10, 11, 12, 13};
  const std::vector<int32_t> labels = {kIgnoreLabel, kIgnoreLabel, 12, 13};
  InstructionSampleOptions o;
  o.seq_length = 6;
  o.pad = 99;
  o.vocab_size = 100;
  TrainingSample s;
  ASSERT_TRUE(assemble_instruction_sample(ids, labels, {}, o, &s).ok());
  EXPECT_EQ(s.tokens, (std::vector<int32_t>{10, 11, 12, 13, 99, 99}));
  EXPECT_EQ(s.labels, (std::vector<int32_t>{0, 12, 13, 0, 0, 0}));
  EXPECT_EQ(s.loss_mask, (std::vector<float>{0, 1, 1, 0, 0, 0}));
  EXPECT_EQ(s.position_ids, (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(s.document_ids, (std::vector<int32_t>(6, 0)));
}

// A neat pack of two samples (3 and 2 ids) and its padding: documents from the attention mask
// (padding one more after the last sample), positions within each sample (0 on the padding).
TEST(InstructionDataset, NeatPackDocumentsAndPositionsComeFromTheAttentionMask) {
  const std::vector<int32_t> ids = {10, 11, 12, 20, 21, 99, 99};
  const std::vector<int32_t> labels = {kIgnoreLabel, 11, 12, kIgnoreLabel, 21, kIgnoreLabel, kIgnoreLabel};
  const std::vector<int32_t> mask = {1, 1, 1, 2, 2, 0, 0};
  InstructionSampleOptions o;
  o.seq_length = 7;
  o.pad = 99;
  o.eos = 98;
  o.vocab_size = 100;
  o.reset_attention_mask = true;
  o.neat_pack = true;
  TrainingSample s;
  ASSERT_TRUE(assemble_instruction_sample(ids, labels, mask, o, &s).ok());
  EXPECT_EQ(s.document_ids, (std::vector<int32_t>{0, 0, 0, 1, 1, 2, 2}));
  EXPECT_EQ(s.position_ids, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6}));  // not reset without the flag
  EXPECT_EQ(s.labels, (std::vector<int32_t>{11, 12, 0, 21, 0, 0, 0}));
  EXPECT_EQ(s.loss_mask, (std::vector<float>{1, 1, 0, 1, 0, 0, 0}));
  o.reset_position_ids = true;
  ASSERT_TRUE(assemble_instruction_sample(ids, labels, mask, o, &s).ok());
  EXPECT_EQ(s.position_ids, (std::vector<int32_t>{0, 1, 2, 0, 1, 0, 0}));
  // A mask that is not 1, 2, ... then 0 is an error naming the position.
  const std::vector<int32_t> bad = {1, 1, 2, 1, 2, 0, 0};
  EXPECT_NE(assemble_instruction_sample(ids, labels, bad, o, &s).message().find("attention mask value 1 at position 3"),
            std::string::npos);
}

// Packs without --neat-pack: a new document (and position run) after each EOS token.
TEST(InstructionDataset, PackedDocumentsEndAtEachEos) {
  const std::vector<int32_t> ids = {10, 11, 98, 20, 98, 99};
  const std::vector<int32_t> labels = {kIgnoreLabel, 11, 98, kIgnoreLabel, 98, kIgnoreLabel};
  InstructionSampleOptions o;
  o.seq_length = 8;
  o.pad = 99;
  o.eos = 98;
  o.vocab_size = 100;
  o.reset_attention_mask = true;
  TrainingSample s;
  ASSERT_TRUE(assemble_instruction_sample(ids, labels, {}, o, &s).ok());
  EXPECT_EQ(s.document_ids, (std::vector<int32_t>{0, 0, 0, 1, 1, 2, 2, 2}));
  EXPECT_EQ(s.position_ids, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  o.reset_position_ids = true;
  ASSERT_TRUE(assemble_instruction_sample(ids, labels, {}, o, &s).ok());
  EXPECT_EQ(s.position_ids, (std::vector<int32_t>{0, 1, 2, 0, 1, 0, 1, 2}));
}

TEST(InstructionDataset, SampleErrors) {
  InstructionSampleOptions o;
  o.seq_length = 3;
  o.vocab_size = 100;
  TrainingSample s;
  const std::vector<int32_t> four = {1, 2, 3, 4};
  EXPECT_NE(assemble_instruction_sample(four, four, {}, o, &s).message().find("more than --seq-length 3"),
            std::string::npos);
  const std::vector<int32_t> bad = {1, 200};
  EXPECT_NE(assemble_instruction_sample(bad, bad, {}, o, &s).message().find("outside the tokenizer's vocabulary"),
            std::string::npos);
}

}  // namespace
}  // namespace gale
