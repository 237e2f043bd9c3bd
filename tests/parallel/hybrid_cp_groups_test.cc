// Hybrid context parallelism's splits: after the Ulysses all-to-all each ring rank holds its
// load-balanced block, in its local order, and the ring's blocks cover the whole sequence.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "parallel/hybrid_cp_groups.h"

namespace gale {
namespace {

// For every (CP, U): position p of the Ulysses all-to-all's output on cp rank c (the "global"
// order of the split {S/R, U, k}) comes from Ulysses member j = the rank holding p there, local
// position s; that row is global position ContextSplit{S, CP, gU + j}.global_position(s), and it
// must be the ring split's local position p. The ring ranks' positions together are 0..S−1.
TEST(HybridCpSplits, UlyssesOutputIsTheRingRanksBlockInOrder) {
  for (const auto& [cp, U] : std::vector<std::pair<int64_t, int64_t>>{{4, 2}, {8, 2}, {8, 4}, {6, 2}, {6, 3}}) {
    const int64_t S = 4 * cp, R = cp / U;
    std::vector<int32_t> all;
    for (int64_t c = 0; c < cp; ++c) {
      const ContextSplit us = hybrid_ulysses_split(S, cp, U, c), rs = hybrid_ring_split(S, cp, U, c);
      ASSERT_EQ(us.cp_size, U);
      ASSERT_EQ(us.cp_rank, c % U);
      ASSERT_EQ(rs.cp_size, R);
      ASSERT_EQ(rs.cp_rank, c / U);
      ASSERT_EQ(us.seq_length, rs.local_length());
      const std::vector<int32_t> ring = rs.local_positions();
      std::vector<int32_t> from_ulysses(ring.size(), -1);
      for (int64_t j = 0; j < U; ++j) {
        const ContextSplit member{S, cp, (c / U) * U + j};
        for (int64_t s = 0; s < member.local_length(); ++s)
          from_ulysses[static_cast<size_t>(us.global_position(s, j))] = static_cast<int32_t>(member.global_position(s));
      }
      EXPECT_EQ(from_ulysses, ring) << "CP " << cp << ", U " << U << ", cp rank " << c;
      if (c % U == 0) all.insert(all.end(), ring.begin(), ring.end());
    }
    std::sort(all.begin(), all.end());
    std::vector<int32_t> whole(static_cast<size_t>(S));
    std::iota(whole.begin(), whole.end(), 0);
    EXPECT_EQ(all, whole) << "CP " << cp << ", U " << U;
  }
}

// CP 4, U 2, 16 positions (chunks of 2): Ulysses group {0, 1} holds chunks 0, 1, 6, 7, which is
// ring rank 0's block; group {2, 3} chunks 2, 3, 4, 5.
TEST(HybridCpSplits, FourRanksWorkedExample) {
  EXPECT_EQ(hybrid_ring_split(16, 4, 2, 0).local_positions(),
            (std::vector<int32_t>{0, 1, 2, 3, 12, 13, 14, 15}));
  EXPECT_EQ(hybrid_ring_split(16, 4, 2, 3).local_positions(), (std::vector<int32_t>{4, 5, 6, 7, 8, 9, 10, 11}));
}

}  // namespace
}  // namespace gale
