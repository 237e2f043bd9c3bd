// ParallelState on MPI: for several layouts, every group communicator has exactly the members the
// rank layout lists (checked by a collective over it), in the right order, and embedding groups
// exist only on first and last pipeline stages.
#include <gtest/gtest.h>

#include <numeric>

#include "mpi_test_env.h"
#include "parallel/parallel_state.h"

namespace gale {
namespace {

struct Sizes {
  int tp, pp, cp, ep, etp;
  bool tp_pp_dp;
};

TEST(ParallelState, GroupsMatchTheLayoutOnEveryRank) {
  Comm w = test::world();
  const Sizes all[] = {{1, 1, 1, 1, 0, false}, {2, 1, 1, 1, 0, false}, {1, 2, 1, 1, 0, false}, {2, 2, 1, 1, 0, false},
                       {4, 1, 1, 1, 0, false}, {1, 4, 1, 1, 0, false}, {2, 2, 1, 1, 0, true},  {1, 2, 2, 1, 0, false},
                       {2, 2, 1, 2, 1, false}, {1, 1, 1, 4, 1, false}, {2, 4, 1, 1, 0, false}, {1, 8, 1, 1, 0, false}};
  int tested = 0;
  for (const Sizes& z : all) {
    ParallelSizes s;
    s.world_size = w->size(), s.tp = z.tp, s.pp = z.pp, s.cp = z.cp, s.ep = z.ep, s.etp = z.etp;
    s.use_tp_pp_dp_mapping = z.tp_pp_dp;
    StatusOr<RankLayout> layout = compute_rank_layout(s);
    if (!layout.ok()) continue;  // not a layout of this world size
    ++tested;
    SCOPED_TRACE(::testing::Message() << "tp " << z.tp << " pp " << z.pp << " cp " << z.cp << " ep " << z.ep);
    ParallelState ps = ParallelState::create(w, layout.value());
    const int me = w->rank();
    EXPECT_EQ(ps.world_rank(), me);
    RankCoords c = layout->coords(me);
    EXPECT_EQ(ps.coords().tp, c.tp);
    EXPECT_EQ(ps.coords().pp, c.pp);
    EXPECT_EQ(ps.is_pipeline_first_stage(), c.pp == 0);
    EXPECT_EQ(ps.is_pipeline_last_stage(), c.pp == z.pp - 1);
    EXPECT_EQ(ps.tp()->rank(), c.tp);
    EXPECT_EQ(ps.pp()->rank(), c.pp);
    EXPECT_EQ(ps.dp()->rank(), c.dp);
    EXPECT_EQ(ps.tp()->size(), z.tp);
    EXPECT_EQ(ps.dp_size(), layout->dp);
    for (int g = 0; g < kNumGroups; ++g) {
      Group kind = static_cast<Group>(g);
      std::vector<int> expect = layout->group_of(kind, me);
      const Comm& comm = ps.group(kind);
      if (expect.empty()) {
        EXPECT_EQ(comm, nullptr) << group_name(kind);
      }
      // Even non-members take part in nothing; members check membership with a collective.
      if (!comm) continue;
      EXPECT_EQ(comm->name(), group_name(kind));
      EXPECT_EQ(comm->world_ranks(), expect) << group_name(kind);
      int64_t sum = comm->all_reduce_scalar(static_cast<int64_t>(me));
      EXPECT_EQ(sum, std::accumulate(expect.begin(), expect.end(), int64_t{0})) << group_name(kind);
      std::vector<int32_t> order(comm->size());
      int32_t mine = me;
      comm->all_gather(&mine, order.data(), 1, DType::kI32);
      EXPECT_EQ(std::vector<int>(order.begin(), order.end()), expect) << group_name(kind);
    }
    bool middle = c.pp != 0 && c.pp != z.pp - 1;
    EXPECT_EQ(ps.embedding() == nullptr, middle);
    EXPECT_EQ(ps.position_embedding() == nullptr, c.pp != 0);
    ps.reset_stats();
    ps.tp()->all_reduce_scalar(1.0);
    ps.dp()->all_reduce_scalar(1.0);
    EXPECT_EQ(ps.total_stats().calls[static_cast<int>(CommOp::kAllReduce)], 2);
  }
  EXPECT_GE(tested, 1);
}

TEST(ParallelState, SingleProcessDefault) {
  ParallelState ps;
  EXPECT_EQ(ps.world_size(), 1);
  EXPECT_EQ(ps.tp()->size(), 1);
  EXPECT_TRUE(ps.is_pipeline_first_stage());
  EXPECT_TRUE(ps.is_pipeline_last_stage());
  EXPECT_NE(ps.embedding(), nullptr);
}

}  // namespace
}  // namespace gale
