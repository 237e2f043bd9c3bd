// Sample assembly (Megatron's GPTDataset.__getitem__ + _get_ltor_masks_and_position_ids) on
// hand-checked cases: tokens/labels shift, EOD loss masking, position and document resets, pads.
#include "data/sample.h"

#include <gtest/gtest.h>

namespace gale {
namespace {

using V = std::vector<int32_t>;

TEST(AssembleSample, ShiftsByOneAndDefaultsToPlainCausal) {
  TrainingSample s;
  SampleOptions o;
  o.eod = 9;
  assemble_sample(V{5, 6, 9, 7, 8}, 1, o, &s);
  EXPECT_EQ(s.tokens, (V{5, 6, 9, 7}));
  EXPECT_EQ(s.labels, (V{6, 9, 7, 8}));
  EXPECT_EQ(s.loss_mask, (std::vector<float>{1, 1, 1, 1}));
  EXPECT_EQ(s.position_ids, (V{0, 1, 2, 3}));
  EXPECT_EQ(s.document_ids, (V{0, 0, 0, 0}));
}

TEST(AssembleSample, EodFlags) {
  TrainingSample s;
  SampleOptions o;
  o.eod = 9;
  o.eod_mask_loss = true;
  o.reset_position_ids = true;
  o.reset_attention_mask = true;
  assemble_sample(V{9, 5, 6, 9, 9, 7, 8}, 1, o, &s);
  EXPECT_EQ(s.tokens, (V{9, 5, 6, 9, 9, 7}));
  EXPECT_EQ(s.loss_mask, (std::vector<float>{0, 1, 1, 0, 0, 1}));  // loss is masked where the input is EOD
  EXPECT_EQ(s.position_ids, (V{0, 0, 1, 2, 0, 0}));                // restart after each EOD
  EXPECT_EQ(s.document_ids, (V{0, 1, 1, 1, 2, 3}));                // the EOD belongs to the document it ends
}

TEST(AssembleSample, ResetFlagsAreIndependent) {
  TrainingSample s;
  SampleOptions o;
  o.eod = 9;
  o.reset_attention_mask = true;
  assemble_sample(V{1, 9, 2, 3}, 1, o, &s);
  EXPECT_EQ(s.position_ids, (V{0, 1, 2}));
  EXPECT_EQ(s.document_ids, (V{0, 0, 1}));
  o.reset_attention_mask = false;
  o.reset_position_ids = true;
  assemble_sample(V{1, 9, 2, 3}, 1, o, &s);
  EXPECT_EQ(s.position_ids, (V{0, 1, 0}));
  EXPECT_EQ(s.document_ids, (V{0, 0, 0}));
}

TEST(AssembleSample, PadsBecomeZeroWithoutLoss) {
  // A short last sample (drop_last false) is padded with -1; with E = 0 the last label is a pad.
  TrainingSample s;
  SampleOptions o;
  o.eod = 9;
  assemble_sample(V{4, 5, -1, -1}, 1, o, &s);
  EXPECT_EQ(s.tokens, (V{4, 5, 0}));
  EXPECT_EQ(s.labels, (V{5, 0, 0}));
  EXPECT_EQ(s.loss_mask, (std::vector<float>{1, 0, 0}));
  assemble_sample(V{4, 5, 6}, 0, o, &s);
  EXPECT_EQ(s.tokens, (V{4, 5, 6}));
  EXPECT_EQ(s.labels, (V{5, 6, 0}));
  EXPECT_EQ(s.loss_mask, (std::vector<float>{1, 1, 0}));
}

TEST(AssembleSample, TokenizerPadIdIsMaskedLikeMegatron) {
  // Megatron uses tokenizer.pad when the tokenizer has one (e.g. SentencePieceTokenizer's <PAD>).
  TrainingSample s;
  SampleOptions o;
  o.eod = 9;
  o.pad = 3;
  assemble_sample(V{3, 5, 3, 6}, 1, o, &s);
  EXPECT_EQ(s.tokens, (V{0, 5, 0}));
  EXPECT_EQ(s.labels, (V{5, 0, 6}));
  EXPECT_EQ(s.loss_mask, (std::vector<float>{1, 0, 1}));
}

}  // namespace
}  // namespace gale
