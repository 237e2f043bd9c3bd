// Context parallelism's sequence split: which global positions each cp rank holds, and its errors.
#include <gtest/gtest.h>

#include <algorithm>

#include "parallel/context_split.h"

namespace gale {
namespace {

std::vector<int32_t> positions(int64_t S, int64_t cp, int64_t rank) {
  auto split = make_context_split(S, cp, rank);
  EXPECT_TRUE(split.ok()) << split.status().to_string();
  return split.value().local_positions();
}

TEST(ContextSplit, TwoRanksHoldChunksRAnd2NMinus1MinusR) {
  // 16 positions, CP 2: chunks of 4; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2.
  EXPECT_EQ(positions(16, 2, 0), (std::vector<int32_t>{0, 1, 2, 3, 12, 13, 14, 15}));
  EXPECT_EQ(positions(16, 2, 1), (std::vector<int32_t>{4, 5, 6, 7, 8, 9, 10, 11}));
}

TEST(ContextSplit, FourRanks) {
  // 16 positions, CP 4: chunks of 2; rank r holds chunks r and 7 - r.
  EXPECT_EQ(positions(16, 4, 0), (std::vector<int32_t>{0, 1, 14, 15}));
  EXPECT_EQ(positions(16, 4, 1), (std::vector<int32_t>{2, 3, 12, 13}));
  EXPECT_EQ(positions(16, 4, 2), (std::vector<int32_t>{4, 5, 10, 11}));
  EXPECT_EQ(positions(16, 4, 3), (std::vector<int32_t>{6, 7, 8, 9}));
}

TEST(ContextSplit, RanksPartitionTheSequenceWithEqualCausalWork) {
  for (int64_t cp : {2, 3, 4, 8}) {
    const int64_t S = 2 * cp * 5;
    std::vector<int32_t> all;
    int64_t work0 = -1;
    for (int64_t r = 0; r < cp; ++r) {
      std::vector<int32_t> p = positions(S, cp, r);
      ASSERT_EQ(static_cast<int64_t>(p.size()), S / cp);
      int64_t work = 0;  // keys a causal query sees
      for (int32_t q : p) work += q + 1;
      if (work0 < 0) work0 = work;
      EXPECT_EQ(work, work0) << "cp " << cp << " rank " << r;
      all.insert(all.end(), p.begin(), p.end());
    }
    std::sort(all.begin(), all.end());
    for (int64_t i = 0; i < S; ++i) EXPECT_EQ(all[static_cast<size_t>(i)], i);
  }
}

TEST(ContextSplit, OneRankIsTheIdentity) {
  EXPECT_EQ(positions(6, 1, 0), (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
}

TEST(ContextSplit, SequenceNotAMultipleOfTwoCpIsAnError) {
  auto split = make_context_split(12, 4, 0);
  ASSERT_FALSE(split.ok());
  EXPECT_EQ(split.status().message(),
            "--seq-length 12 must be divisible by 2 x --context-parallel-size 4 = 8 (each sequence is cut into 2·CP "
            "equal chunks)");
}

}  // namespace
}  // namespace gale
