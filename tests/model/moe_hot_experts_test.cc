// The hot-expert choice of --balanced-moe-experts (MindSpeed's greedy rule) and the per-rank rows it
// leads to, on hand-computed counts.
#include <gtest/gtest.h>

#include "model/moe_hot_experts.h"

namespace gale {
namespace {

using V = std::vector<int64_t>;

TEST(MoeHotExperts, GreedyBusiestExpertOfTheBusiestRank) {
  // EP 2, 4 experts (rank 0: 0 and 1); rows of rank 0 then rank 1 per expert
  const V counts = {10, 5, 1, 0, /* rank 1 */ 8, 2, 3, 1};
  // loads 25 and 5: expert 0 (18 rows) leaves rank 0, whose own 10 come back: 17 and 13
  EXPECT_EQ(select_hot_experts(counts, 2, 4, 1), (V{0}));
  // then rank 0's expert 1 (7 rows): 15 and 15
  EXPECT_EQ(select_hot_experts(counts, 2, 4, 2), (V{0, 1}));
  EXPECT_EQ(expert_rows_per_rank(counts, 2, 4, {0, 1}), (V{15, 15}));
  EXPECT_EQ(expert_rows_per_rank(counts, 2, 4, {}), (V{25, 5}));
  EXPECT_EQ(select_hot_experts(counts, 2, 4, 0), (V{}));
}

TEST(MoeHotExperts, ExpertsNeverChosenTwiceAndSorted) {
  // rank 0 stays the busiest after both its experts are taken: the third is the busiest elsewhere
  const V counts = {10, 10, 0, 0, /* rank 1 */ 0, 0, 1, 2};
  EXPECT_EQ(select_hot_experts(counts, 2, 4, 3), (V{0, 1, 3}));
  // EP 4, 8 experts: the hottest expert sits on rank 3, the next busiest rank is 1
  V four(32, 1);
  for (int64_t s = 0; s < 4; ++s) four[s * 8 + 7] = 20;  // expert 7 (rank 3): 80 rows
  for (int64_t s = 0; s < 4; ++s) four[s * 8 + 2] = 6;   // expert 2 (rank 1): 24 rows
  EXPECT_EQ(select_hot_experts(four, 4, 8, 1), (V{7}));
  EXPECT_EQ(select_hot_experts(four, 4, 8, 2), (V{2, 7}));
  const V rows = expert_rows_per_rank(four, 4, 8, {2, 7});
  int64_t total = 0;
  for (int64_t r : rows) total += r;
  EXPECT_EQ(total, 4 * (6 * 1 + 20 + 6));  // every row once
  EXPECT_EQ(rows, (V{8 + 26, 4 + 26, 8 + 26, 4 + 26}));
}

}  // namespace
}  // namespace gale
