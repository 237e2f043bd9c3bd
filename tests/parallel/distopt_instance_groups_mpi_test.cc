// The partial distributed optimizer's sub-groups: instances of consecutive dp-cp ranks and the
// groups across them, as Megatron's parallel_state builds them.
#include <gtest/gtest.h>

#include <vector>

#include "mpi_test_env.h"
#include "parallel/distopt_instance_groups.h"

namespace gale {
namespace {

TEST(DistOptInstanceGroups, ConsecutiveInstancesAndStridedAcross) {
  Comm world = test::world();
  const int M = world->size();
  for (int N = 1; N <= M; ++N) {
    if (M % N != 0) continue;
    SCOPED_TRACE("instances " + std::to_string(N));
    const DistOptInstanceGroups g = make_distopt_instance_groups(world, N);
    if (N == 1) {
      EXPECT_EQ(g.intra, nullptr);
      EXPECT_EQ(g.inter, nullptr);
      EXPECT_EQ(g.instance_id(), 0);
      continue;
    }
    const int I = M / N, r = world->rank();
    std::vector<int> intra, inter;
    for (int j = 0; j < I; ++j) intra.push_back((r / I) * I + j);
    for (int j = 0; j < N; ++j) inter.push_back(j * I + r % I);
    ASSERT_NE(g.intra, nullptr);
    ASSERT_NE(g.inter, nullptr);
    EXPECT_EQ(g.intra->world_ranks(), intra);
    EXPECT_EQ(g.inter->world_ranks(), inter);
    EXPECT_EQ(g.intra->rank(), r % I);
    EXPECT_EQ(g.instance_id(), r / I);
    // The groups really connect those ranks: the sum of world ranks over each.
    int64_t intra_sum = r, inter_sum = r;
    intra_sum = g.intra->all_reduce_scalar(intra_sum, ReduceOp::kSum);
    inter_sum = g.inter->all_reduce_scalar(inter_sum, ReduceOp::kSum);
    int64_t want_intra = 0, want_inter = 0;
    for (int x : intra) want_intra += x;
    for (int x : inter) want_inter += x;
    EXPECT_EQ(intra_sum, want_intra);
    EXPECT_EQ(inter_sum, want_inter);
  }
}

}  // namespace
}  // namespace gale
