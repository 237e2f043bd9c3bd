// The dist-train rank map (parallel/dist_train_layout.h): ranks → sub-world → grid coordinates and
// global pipeline stage, each data-parallel replica's pipeline, and the peers of the transfers
// inside a sub-world and across the boundary between TP sizes that differ (MindSpeed's block-wise
// matching of the two TP groups, keeping the message the receiver uses).
#include <gtest/gtest.h>

#include "parallel/dist_train_layout.h"

namespace gale {
namespace {

DistTrainSubWorld subworld(const char* name, int first_rank, int tp, int pp, int dp, int first_stage, int layers) {
  DistTrainSubWorld s;
  s.name = name;
  s.first_rank = first_rank;
  s.world_size = tp * pp * dp;
  s.tp = tp;
  s.pp = pp;
  s.dp = dp;
  s.first_stage = first_stage;
  s.num_layers = layers;
  return s;
}

// 12 ranks: "vit" TP 1 x PP 1 x DP 2 (ranks 0-1), "gpt" TP 2 x PP 2 x DP 2 (ranks 2-9)... and a third
// sub-world TP 1 x PP 1 x DP 2 (ranks 10-11): three stages of one chain per DP index.
// Whole-tensor peers of the given ranks.
std::vector<DistTrainLayout::Peer> peers(std::vector<int> ranks) {
  std::vector<DistTrainLayout::Peer> out;
  for (int r : ranks) out.push_back(DistTrainLayout::Peer{r, 0, 1});
  return out;
}

DistTrainLayout three_subworlds() {
  DistTrainLayout l;
  l.subworlds = {subworld("vit", 0, 1, 1, 2, 0, 2), subworld("gpt", 2, 2, 2, 2, 1, 4),
                 subworld("head", 10, 1, 1, 2, 3, 1)};
  return l;
}

TEST(DistTrainLayout, RanksToSubWorldsAndCoordinates) {
  const DistTrainLayout l = three_subworlds();
  EXPECT_EQ(l.world_size(), 12);
  EXPECT_EQ(l.num_stages(), 4);
  EXPECT_EQ(l.dp(), 2);
  const int subworld[] = {0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2};
  // Inside "gpt" (first rank 2): local rank = tp + 2·(dp + 2·pp).
  const int tp[] = {0, 0, 0, 1, 0, 1, 0, 1, 0, 1, 0, 0};
  const int dp[] = {0, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0, 1};
  const int stage[] = {0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3};
  for (int r = 0; r < 12; ++r) {
    EXPECT_EQ(l.subworld_of(r), subworld[r]) << r;
    EXPECT_EQ(l.tp_of(r), tp[r]) << r;
    EXPECT_EQ(l.dp_of(r), dp[r]) << r;
    EXPECT_EQ(l.stage_of(r), stage[r]) << r;
  }
  EXPECT_EQ(l.rank_at(1, 1, 1, 1), 9);
  EXPECT_EQ(l.subworld_of_stage(2), 1);
  EXPECT_EQ(l.pipeline_ranks(0), (std::vector<int>{0, 2, 3, 6, 7, 10}));
  EXPECT_EQ(l.pipeline_ranks(1), (std::vector<int>{1, 4, 5, 8, 9, 11}));
  EXPECT_EQ(l.stage_layers(), (std::vector<int64_t>{2, 2, 2, 1}));
}

TEST(DistTrainLayout, PeersInsideAndAcrossSubWorlds) {
  const DistTrainLayout l = three_subworlds();
  // TP 1 → TP 2 (DP index 1: rank 1 → ranks 4, 5): one sender, both receive from it.
  EXPECT_EQ(l.targets_of(1, 1), peers({4, 5}));
  EXPECT_EQ(l.sources_of(4, 0), peers({1}));
  EXPECT_EQ(l.sources_of(5, 0), peers({1}));
  // ... backward the TP-2 stage's rank of tp 0 sends the gradient; its tp-1 rank sends nothing.
  EXPECT_EQ(l.sources_of(1, 1), peers({4}));
  EXPECT_EQ(l.targets_of(4, 0), peers({1}));
  EXPECT_TRUE(l.targets_of(5, 0).empty());
  // Inside "gpt": the same tp coordinate one stage on.
  EXPECT_EQ(l.targets_of(3, 2), peers({7}));
  EXPECT_EQ(l.sources_of(7, 1), peers({3}));
  EXPECT_EQ(l.sources_of(3, 2), peers({7}));
  // TP 2 → TP 1 (DP index 0: ranks 6, 7 → rank 10): the first of the two sends.
  EXPECT_EQ(l.sources_of(10, 2), peers({6}));
  EXPECT_EQ(l.targets_of(6, 3), peers({10}));
  EXPECT_TRUE(l.targets_of(7, 3).empty());
  // ... and backward rank 10's gradient goes to both.
  EXPECT_EQ(l.targets_of(10, 2), peers({6, 7}));
  EXPECT_EQ(l.sources_of(6, 3), peers({10}));
  EXPECT_EQ(l.sources_of(7, 3), peers({10}));
}

// TP sizes that do not divide each other: 3 → 2 and 2 → 3, every receiver has exactly one source
// and every rank of the larger group is covered when it receives.
TEST(DistTrainLayout, TpSizesThatDoNotDivide) {
  DistTrainLayout l;
  l.subworlds = {subworld("a", 0, 3, 1, 1, 0, 1), subworld("b", 3, 2, 1, 1, 1, 1)};
  EXPECT_EQ(l.sources_of(3, 0), peers({0}));  // ⌊0·3/2⌋
  EXPECT_EQ(l.sources_of(4, 0), peers({1}));  // ⌊1·3/2⌋
  EXPECT_EQ(l.sources_of(0, 1), peers({3}));  // ⌊0·2/3⌋
  EXPECT_EQ(l.sources_of(1, 1), peers({3}));  // ⌊1·2/3⌋
  EXPECT_EQ(l.sources_of(2, 1), peers({4}));  // ⌊2·2/3⌋
  EXPECT_EQ(l.targets_of(3, 0), peers({0, 1}));
  EXPECT_EQ(l.targets_of(4, 0), peers({2}));
  EXPECT_TRUE(l.targets_of(2, 1).empty());
}

// Different DP sizes: "enc" DP 2 (ranks 0-1), "dec" TP 2 x DP 1 (ranks 2-3), "head" DP 2 (ranks 4-5).
// Main DP 1: one pipeline of all 6 ranks; "dec" gathers the two halves of its micro-batch from the
// encoder's replicas, "head"'s replicas each take a slice of the decoder's output.
TEST(DistTrainLayout, DataParallelSizesThatDiffer) {
  DistTrainLayout l;
  l.subworlds = {subworld("enc", 0, 1, 1, 2, 0, 1), subworld("dec", 2, 2, 1, 1, 1, 1),
                 subworld("head", 4, 1, 1, 2, 2, 1)};
  EXPECT_EQ(l.dp(), 1);
  EXPECT_EQ(l.dp_ratio(0), 2);
  EXPECT_EQ(l.dp_ratio(1), 1);
  EXPECT_EQ(l.main_dp_of(1), 0);
  EXPECT_EQ(l.pipeline_ranks(0), (std::vector<int>{0, 1, 2, 3, 4, 5}));
  EXPECT_TRUE(l.first_replica(0));
  EXPECT_FALSE(l.first_replica(1));
  EXPECT_FALSE(l.first_replica(5));
  using P = DistTrainLayout::Peer;
  // enc (DP 2) → dec (DP 1): each decoder TP rank gathers piece r from encoder replica r.
  EXPECT_EQ(l.sources_of(2, 0), (std::vector<P>{{0, 0, 2}, {1, 1, 2}}));
  EXPECT_EQ(l.sources_of(3, 0), (std::vector<P>{{0, 0, 2}, {1, 1, 2}}));
  EXPECT_EQ(l.targets_of(1, 1), (std::vector<P>{{2, 0, 1}, {3, 0, 1}}));
  // ... backward each encoder replica takes its slice of the decoder's TP rank 0's gradient.
  EXPECT_EQ(l.sources_of(1, 1), (std::vector<P>{{2, 0, 1}}));
  EXPECT_EQ(l.targets_of(2, 0), (std::vector<P>{{0, 0, 2}, {1, 1, 2}}));
  EXPECT_TRUE(l.targets_of(3, 0).empty());
  // dec (DP 1) → head (DP 2): slices forward, pieces backward.
  EXPECT_EQ(l.targets_of(2, 2), (std::vector<P>{{4, 0, 2}, {5, 1, 2}}));
  EXPECT_TRUE(l.targets_of(3, 2).empty());
  EXPECT_EQ(l.sources_of(5, 1), (std::vector<P>{{2, 0, 1}}));
  EXPECT_EQ(l.sources_of(3, 2), (std::vector<P>{{4, 0, 2}, {5, 1, 2}}));
  EXPECT_EQ(l.targets_of(5, 1), (std::vector<P>{{2, 0, 1}, {3, 0, 1}}));
}

// Context parallelism: rank = tp + TP·(cp + CP·(dp + DP·pp)) inside a sub-world; transfers keep cp.
TEST(DistTrainLayout, ContextParallelCoordinates) {
  DistTrainLayout l;
  DistTrainSubWorld a = subworld("a", 0, 1, 1, 1, 0, 1), b = subworld("b", 2, 2, 1, 1, 1, 1);
  a.cp = b.cp = 2;
  a.world_size = 2;
  b.world_size = 4;
  l.subworlds = {a, b};
  EXPECT_EQ(l.world_size(), 6);
  EXPECT_EQ(l.cp_of(1), 1);
  EXPECT_EQ(l.cp_of(4), 1);  // b: local rank 2 = tp 0, cp 1
  EXPECT_EQ(l.tp_of(5), 1);
  EXPECT_EQ(l.stage_of(5), 1);
  EXPECT_EQ(l.pipeline_ranks(0), (std::vector<int>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(l.targets_of(1, 1), peers({4, 5}));
  EXPECT_EQ(l.sources_of(5, 0), peers({1}));
  EXPECT_EQ(l.sources_of(1, 1), peers({4}));
  EXPECT_TRUE(l.first_replica(2));
  EXPECT_FALSE(l.first_replica(4));
}

// --sequence-parallel: a TP > 1 stage's ranks hold sequence slices, so across TP 1 → 2 → 4 every
// rank of the larger group gets its own slice and the smaller gathers them.
TEST(DistTrainLayout, SequenceParallelSlices) {
  DistTrainLayout l;
  l.sequence_parallel = true;
  l.subworlds = {subworld("a", 0, 1, 1, 1, 0, 1), subworld("b", 1, 2, 1, 1, 1, 1), subworld("c", 3, 4, 1, 1, 2, 1)};
  using P = DistTrainLayout::Peer;
  // a (whole) → b: slice j of 2 to b's tp j; backward a gathers the two.
  EXPECT_EQ(l.targets_of(0, 1), (std::vector<P>{{1, 0, 2, true}, {2, 1, 2, true}}));
  EXPECT_EQ(l.sources_of(2, 0), (std::vector<P>{{0, 0, 1}}));
  EXPECT_EQ(l.sources_of(0, 1), (std::vector<P>{{1, 0, 2, true}, {2, 1, 2, true}}));
  EXPECT_EQ(l.targets_of(2, 0), (std::vector<P>{{0, 0, 1}}));
  // b (halves) → c (quarters): b's tp 1 sends its halves' halves to c's tp 2 and 3.
  EXPECT_EQ(l.targets_of(2, 2), (std::vector<P>{{5, 0, 2, true}, {6, 1, 2, true}}));
  EXPECT_EQ(l.sources_of(6, 1), (std::vector<P>{{2, 0, 1}}));
  EXPECT_EQ(l.sources_of(2, 2), (std::vector<P>{{5, 0, 2, true}, {6, 1, 2, true}}));
}

}  // namespace
}  // namespace gale
