// The greedy expert placement (MindSpeed's rule) on hand-made loads, the load statistics and the
// renaming of a migrated expert's checkpoint tensors.
#include "model/expert_placement.h"

#include <gtest/gtest.h>

#include "train/expert_placer.h"

namespace gale {
namespace {

TEST(ExpertPlacement, GreedyBalancesHandMadeLoads) {
  // 8 experts over 2 ranks (4 slots each). By load: 0 (80) -> rank 0; 1 (70) -> rank 1;
  // 5 (40) -> rank 1 (70 < 80); 2 (30) -> rank 0 (80 < 110); 6 (20) -> rank 0 (110 = 110: lower rank);
  // 3 (10) -> rank 1 (110 < 130); 7 (5) -> rank 1 (120 < 130); 4 (1) -> rank 0 (rank 1 full).
  const std::vector<double> loads = {80, 70, 30, 10, 1, 40, 20, 5};
  const std::vector<int32_t> p = greedy_expert_placement(loads, 2);
  // rank 0 holds {0, 2, 4, 6} in slots 0..3 (increasing index), rank 1 {1, 3, 5, 7}
  EXPECT_EQ(p, (std::vector<int32_t>{0, 4, 1, 5, 2, 6, 3, 7}));
  EXPECT_EQ(rank_loads(loads, p, 2), (std::vector<double>{131, 125}));
  // identity: rank 0 {0..3} = 190, rank 1 {4..7} = 66
  MoePlacement identity(8);
  EXPECT_TRUE(identity.identity());
  EXPECT_EQ(rank_loads(loads, identity.physical, 2), (std::vector<double>{190, 66}));
  EXPECT_NEAR(coefficient_of_variation({190, 66}), 62.0 / 128.0, 1e-12);
  EXPECT_LT(coefficient_of_variation(rank_loads(loads, p, 2)), 0.03);
}

TEST(ExpertPlacement, GreedyOverFourRanksAndTies) {
  // 8 experts, 4 ranks of 2 slots: 7 (9), 6 (8), 5 (7), 4 (6) take ranks 0..3; 3 (5) -> rank 3 (6),
  // 2 (4) -> rank 2 (7), 1 (3) -> rank 1 (8), 0 (2) -> rank 0 (9).
  const std::vector<int32_t> p = greedy_expert_placement({2, 3, 4, 5, 6, 7, 8, 9}, 4);
  EXPECT_EQ(p, (std::vector<int32_t>{0, 2, 4, 6, 7, 5, 3, 1}));
  EXPECT_EQ(rank_loads({2, 3, 4, 5, 6, 7, 8, 9}, p, 4), (std::vector<double>{11, 11, 11, 11}));
  // equal loads: the ties keep the identity
  EXPECT_EQ(greedy_expert_placement({1, 1, 1, 1}, 2), (std::vector<int32_t>{0, 2, 1, 3}));
  MoePlacement pl(4);
  pl.physical = {0, 2, 1, 3};
  EXPECT_FALSE(pl.identity());
  EXPECT_EQ(pl.global_of_physical(), (std::vector<int32_t>{0, 2, 1, 3}));
  EXPECT_EQ(coefficient_of_variation({0, 0}), 0.0);
}

TEST(ExpertPlacement, RenamesTheGlobalExpert) {
  EXPECT_EQ(renamed_expert("decoder.layers.3.mlp.experts.local_experts.12.linear_fc1.weight", 5),
            "decoder.layers.3.mlp.experts.local_experts.5.linear_fc1.weight");
}

}  // namespace
}  // namespace gale
