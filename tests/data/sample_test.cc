// Sample assembly (Megatron's GPTDataset.__getitem__ + _get_ltor_masks_and_position_ids) on
// hand-checked cases: tokens/labels shift, EOD loss masking, position and document resets, pads.
#include "data/sample.h"

#include <gtest/gtest.h>

#include <string>

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

// The ends of the attention blocks of a sample (MindSpeed's actual_seq_len): where the id changes, and S.
std::vector<int64_t> block_ends(const V& ids) {
  std::vector<int64_t> ends;
  for (size_t i = 1; i <= ids.size(); ++i)
    if (i == ids.size() || ids[i] != ids[i - 1]) ends.push_back(static_cast<int64_t>(i));
  return ends;
}

// The attention mask the document ids express: row i (query) may see column j (key) when j <= i and
// both carry the same id ('1'), as the attention kernels apply it.
std::vector<std::string> mask_of(const V& ids) {
  std::vector<std::string> rows(ids.size(), std::string(ids.size(), '0'));
  for (size_t i = 0; i < ids.size(); ++i)
    for (size_t j = 0; j <= i; ++j) rows[i][j] = ids[i] == ids[j] ? '1' : '0';
  return rows;
}

// MindSpeed's --fix-sub-seq-length L: the blocks are L, 2L, ..., S (the last one shorter) whatever
// the EODs; positions (reset at each EOD) and the loss mask stay. Hand-computed for S = 10, L = 4,
// EODs at positions 2 and 5.
TEST(AssembleSample, FixSubSeqLengthCutsFixedBlocks) {
  const V text{5, 6, 9, 7, 8, 9, 4, 3, 2, 1, 0};
  SampleOptions o;
  o.eod = 9;
  o.reset_position_ids = true;
  o.reset_attention_mask = true;
  TrainingSample documents, fixed;
  assemble_sample(text, 1, o, &documents);
  EXPECT_EQ(documents.document_ids, (V{0, 0, 0, 1, 1, 1, 2, 2, 2, 2}));
  EXPECT_EQ(block_ends(documents.document_ids), (std::vector<int64_t>{3, 6, 10}));
  o.fix_sub_seq_length = 4;
  assemble_sample(text, 1, o, &fixed);
  EXPECT_EQ(fixed.document_ids, (V{0, 0, 0, 0, 1, 1, 1, 1, 2, 2}));
  EXPECT_EQ(block_ends(fixed.document_ids), (std::vector<int64_t>{4, 8, 10}));  // MindSpeed's actual_seq_len
  EXPECT_EQ(mask_of(fixed.document_ids), (std::vector<std::string>{
                                             "1000000000",
                                             "1100000000",
                                             "1110000000",
                                             "1111000000",
                                             "0000100000",
                                             "0000110000",
                                             "0000111000",
                                             "0000111100",
                                             "0000000010",
                                             "0000000011",
                                         }));
  // Everything else as without it: positions restart after each EOD, every token has loss.
  EXPECT_EQ(fixed.position_ids, (V{0, 1, 2, 0, 1, 2, 0, 1, 2, 3}));
  EXPECT_EQ(fixed.position_ids, documents.position_ids);
  EXPECT_EQ(fixed.tokens, documents.tokens);
  EXPECT_EQ(fixed.labels, documents.labels);
  EXPECT_EQ(fixed.loss_mask, documents.loss_mask);
}

TEST(AssembleSample, FixSubSeqLengthEdgeValues) {
  const V text{5, 6, 9, 7, 8, 9, 4, 3, 2, 1, 0};
  SampleOptions o;
  o.eod = 9;
  o.reset_attention_mask = true;
  TrainingSample s;
  o.fix_sub_seq_length = 10;  // L = S: one block, plain causal attention
  assemble_sample(text, 1, o, &s);
  EXPECT_EQ(s.document_ids, V(10, 0));
  o.fix_sub_seq_length = 1;  // every token alone
  assemble_sample(text, 1, o, &s);
  EXPECT_EQ(s.document_ids, (V{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  o.fix_sub_seq_length = 3;  // ceil(10 / 3) = 4 blocks, the last of one token
  assemble_sample(text, 1, o, &s);
  EXPECT_EQ(block_ends(s.document_ids), (std::vector<int64_t>{3, 6, 9, 10}));
  for (int64_t L : {11, 0, -1}) {  // L > S or L <= 0: the documents
    o.fix_sub_seq_length = L;
    assemble_sample(text, 1, o, &s);
    EXPECT_EQ(s.document_ids, (V{0, 0, 0, 1, 1, 1, 2, 2, 2, 2})) << L;
  }
  o.reset_attention_mask = false;  // without --reset-attention-mask nothing is cut
  o.fix_sub_seq_length = 4;
  assemble_sample(text, 1, o, &s);
  EXPECT_EQ(s.document_ids, V(10, 0));
}

}  // namespace
}  // namespace gale
