// Context parallelism in the model: a micro-batch sliced to one cp rank's positions.
#include <gtest/gtest.h>

#include "model/context_parallel.h"

namespace gale {
namespace {

// B = 2 samples of 8 tokens; every per-token value encodes (sample, position).
MicroBatch whole_sequences(bool documents) {
  MicroBatch mb;
  mb.B = 2;
  mb.S = 8;
  for (int32_t b = 0; b < 2; ++b)
    for (int32_t s = 0; s < 8; ++s) {
      mb.tokens.push_back(100 * b + s);
      mb.labels.push_back(100 * b + s + 1);
      mb.loss_mask.push_back(static_cast<float>(s % 3));
      mb.position_ids.push_back(s % 5);
      if (documents) mb.document_ids.push_back(s / 3 + b);
    }
  mb.sample_ids = {40, 41};
  return mb;
}

TEST(ContextParallelSlice, KeepsThisRanksPositionsOfEachSample) {
  const MicroBatch full = whole_sequences(true);
  // CP 2: chunks of 2; rank 1 holds positions 2, 3, 4, 5.
  const MicroBatch mb = slice_micro_batch(full, make_context_split(8, 2, 1).value());
  EXPECT_EQ(mb.B, 2);
  EXPECT_EQ(mb.S, 4);
  EXPECT_EQ(mb.S_global, 8);
  EXPECT_EQ(mb.seq_positions, (std::vector<int32_t>{2, 3, 4, 5}));
  EXPECT_EQ(mb.tokens, (std::vector<int32_t>{2, 3, 4, 5, 102, 103, 104, 105}));
  EXPECT_EQ(mb.labels, (std::vector<int32_t>{3, 4, 5, 6, 103, 104, 105, 106}));
  EXPECT_EQ(mb.loss_mask, (std::vector<float>{2, 0, 1, 2, 2, 0, 1, 2}));
  EXPECT_EQ(mb.position_ids, (std::vector<int32_t>{2, 3, 4, 0, 2, 3, 4, 0}));
  EXPECT_EQ(mb.document_ids, (std::vector<int32_t>{0, 1, 1, 1, 1, 2, 2, 2}));
  EXPECT_EQ(mb.key_document_ids, full.document_ids);  // the keys are the whole sequences
  EXPECT_EQ(mb.sample_ids, full.sample_ids);
  EXPECT_EQ(mb.global_length(), 8);
  EXPECT_EQ(mb.seq_position(3), 5);
}

TEST(ContextParallelSlice, RankZeroHoldsTheFirstAndLastChunks) {
  const MicroBatch mb = slice_micro_batch(whole_sequences(false), make_context_split(8, 2, 0).value());
  EXPECT_EQ(mb.tokens, (std::vector<int32_t>{0, 1, 6, 7, 100, 101, 106, 107}));
  EXPECT_TRUE(mb.document_ids.empty());
  EXPECT_TRUE(mb.key_document_ids.empty());
}

TEST(ContextParallelSlice, OneRankKeepsTheMicroBatch) {
  const MicroBatch full = whole_sequences(true);
  const MicroBatch mb = slice_micro_batch(full, make_context_split(8, 1, 0).value());
  EXPECT_EQ(mb.S, 8);
  EXPECT_EQ(mb.global_length(), 8);
  EXPECT_TRUE(mb.seq_positions.empty());
  EXPECT_EQ(mb.tokens, full.tokens);
}

}  // namespace
}  // namespace gale
