// The fake communicator of --fake-process-group: what every operation leaves in its buffers (as
// comm/fake_communicator.h documents), sub-groups, byte counters, and $WORLD_SIZE / $RANK parsing.
#include "comm/fake_communicator.h"

#include <gtest/gtest.h>

#include <vector>

#include "scoped_env.h"

namespace gale {
namespace {

using testing::ScopedEnv;

Comm rank_of(int rank, int size) {
  std::vector<int> ranks;
  for (int r = 0; r < size; ++r) ranks.push_back(r);
  return make_fake_communicator(rank, ranks, "world");
}

TEST(FakeCommunicator, AllReduceAndBroadcastLeaveTheLocalValue) {
  Comm c = rank_of(2, 4);
  EXPECT_STREQ(c->backend(), "fake");
  EXPECT_EQ(c->rank(), 2);
  EXPECT_EQ(c->size(), 4);
  std::vector<float> v = {1.5f, -2.0f, 3.0f};
  c->all_reduce(v.data(), 3, DType::kF32, ReduceOp::kSum);
  EXPECT_EQ(v, (std::vector<float>{1.5f, -2.0f, 3.0f}));
  c->all_reduce(v.data(), 3, DType::kF32, ReduceOp::kMax);
  EXPECT_EQ(v, (std::vector<float>{1.5f, -2.0f, 3.0f}));
  c->broadcast(v.data(), 3, DType::kF32, 0);
  EXPECT_EQ(v, (std::vector<float>{1.5f, -2.0f, 3.0f}));
  EXPECT_EQ(c->all_reduce_scalar(7.0), 7.0);
}

TEST(FakeCommunicator, AllGatherCopiesTheOwnBlockEverywhere) {
  Comm c = rank_of(1, 3);
  const std::vector<int64_t> send = {10, 11};
  std::vector<int64_t> recv(6, -1);
  c->all_gather(send.data(), recv.data(), 2, DType::kI64);
  EXPECT_EQ(recv, (std::vector<int64_t>{10, 11, 10, 11, 10, 11}));
  std::vector<int64_t> in_place = {0, 0, 20, 21, 0, 0};  // the own block already in place
  c->all_gather(in_place.data() + 2, in_place.data(), 2, DType::kI64);
  EXPECT_EQ(in_place, (std::vector<int64_t>{20, 21, 20, 21, 20, 21}));
}

TEST(FakeCommunicator, ReduceScatterKeepsTheOwnContribution) {
  Comm c = rank_of(1, 3);
  const std::vector<float> send = {1, 2, 3, 4, 5, 6};
  std::vector<float> recv(2, -1.0f);
  c->reduce_scatter(send.data(), recv.data(), 2, DType::kF32);
  EXPECT_EQ(recv, (std::vector<float>{3, 4}));
  std::vector<float> in_place = send;  // Megatron's way: the output is the own block of the input
  c->reduce_scatter(in_place.data(), in_place.data() + 2, 2, DType::kF32);
  EXPECT_EQ(in_place, send);
}

TEST(FakeCommunicator, AllToAllDeliversTheOwnBlockFromEveryRank) {
  Comm c = rank_of(2, 3);
  const std::vector<int64_t> send = {1, 2, 3};  // e.g. token counts per destination rank
  std::vector<int64_t> recv(3, -1);
  c->all_to_all(send.data(), recv.data(), 1, DType::kI64);
  EXPECT_EQ(recv, (std::vector<int64_t>{3, 3, 3}));  // every rank sends rank 2 what rank 2 sends itself
  std::vector<int64_t> in_place = send;
  c->all_to_all(in_place.data(), in_place.data(), 1, DType::kI64);
  EXPECT_EQ(in_place, (std::vector<int64_t>{3, 3, 3}));
}

TEST(FakeCommunicator, AllToAllvCutsOrZeroPadsTheOwnBlock) {
  Comm c = rank_of(1, 3);
  // Rank 1 sends 1 element to rank 0, 2 to itself, 1 to rank 2.
  const std::vector<float> send = {9, 7, 8, 6};
  const std::vector<int64_t> send_counts = {1, 2, 1}, send_displs = {0, 1, 3};
  const std::vector<int64_t> recv_counts = {3, 2, 1}, recv_displs = {0, 3, 5};
  std::vector<float> recv(6, -1.0f);
  c->all_to_allv_async(send.data(), send_counts, send_displs, recv.data(), recv_counts, recv_displs, DType::kF32)
      ->wait();
  EXPECT_EQ(recv, (std::vector<float>{7, 8, 0, 7, 8, 7}));
  EXPECT_EQ(c->stats().bytes[static_cast<int>(CommOp::kAllToAll)], 4 * 4);
}

TEST(FakeCommunicator, SendIsDroppedAndRecvGivesZeros) {
  Comm c = rank_of(0, 2);
  std::vector<float> buf = {1.0f, 2.0f};
  WorkPtr s = c->send_async(buf.data(), 2, DType::kF32, 1, 5);
  EXPECT_TRUE(s->test());  // complete at once: no pipeline schedule waits on it
  EXPECT_EQ(buf, (std::vector<float>{1.0f, 2.0f}));
  WorkPtr r = c->recv_async(buf.data(), 2, DType::kF32, 1, 5);
  EXPECT_TRUE(r->test());
  EXPECT_EQ(buf, (std::vector<float>{0.0f, 0.0f}));
  c->barrier();
}

TEST(FakeCommunicator, CountsCallsAndBytesAsTheMpiBackend) {
  Comm c = rank_of(0, 4);
  std::vector<float> a(8), b(32);
  c->all_reduce(a.data(), 8, DType::kF32);
  c->reduce_scatter(b.data(), a.data(), 8, DType::kF32);
  c->all_gather(a.data(), b.data(), 8, DType::kF32);
  c->send(a.data(), 8, DType::kF32, 1);
  c->recv(a.data(), 8, DType::kF32, 3);
  const CommStats& s = c->stats();
  EXPECT_EQ(s.bytes[static_cast<int>(CommOp::kAllReduce)], 32);
  EXPECT_EQ(s.bytes[static_cast<int>(CommOp::kReduceScatter)], 128);  // the full input
  EXPECT_EQ(s.bytes[static_cast<int>(CommOp::kAllGather)], 128);      // the full output
  EXPECT_EQ(s.bytes[static_cast<int>(CommOp::kSend)], 32);
  EXPECT_EQ(s.bytes[static_cast<int>(CommOp::kRecv)], 32);
  EXPECT_EQ(s.total_calls(), 5);
}

TEST(FakeCommunicator, SubGroupsHoldTheirRankAndSize) {
  Comm w = rank_of(5, 8);
  Comm tp = w->make_group({4, 5}, "tp");
  ASSERT_NE(tp, nullptr);
  EXPECT_EQ(tp->rank(), 1);
  EXPECT_EQ(tp->size(), 2);
  EXPECT_EQ(tp->world_ranks(), (std::vector<int>{4, 5}));
  EXPECT_EQ(tp->name(), "tp");
  Comm pp = w->make_group({1, 5}, "pp");
  EXPECT_EQ(pp->rank(), 1);
  Comm sub = pp->make_group({5}, "one");  // a sub-group of a sub-group keeps global ranks
  EXPECT_EQ(sub->rank(), 0);
  EXPECT_EQ(sub->size(), 1);
  EXPECT_EQ(w->make_group({}, "embedding"), nullptr);
}

TEST(InitFakeWorld, ReadsWorldSizeAndRankAsMegatron) {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS", "SLURM_NTASKS"})
    unsetenv(v);
  {
    ScopedEnv size("WORLD_SIZE", "8"), rank("RANK", "6");
    StatusOr<Comm> w = init_fake_world();
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    EXPECT_EQ((*w)->size(), 8);
    EXPECT_EQ((*w)->rank(), 6);
    EXPECT_STREQ((*w)->backend(), "fake");
  }
  {
    unsetenv("WORLD_SIZE");
    unsetenv("RANK");
    StatusOr<Comm> w = init_fake_world();  // Megatron's defaults: WORLD_SIZE 1, RANK 0
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    EXPECT_EQ((*w)->size(), 1);
    EXPECT_EQ((*w)->rank(), 0);
  }
}

TEST(InitFakeWorld, RefusesBadValuesAndMpiLaunches) {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS", "SLURM_NTASKS"})
    unsetenv(v);
  {
    ScopedEnv size("WORLD_SIZE", "4"), rank("RANK", "4");
    StatusOr<Comm> w = init_fake_world();
    ASSERT_FALSE(w.ok());
    EXPECT_EQ(w.status().message(), "--fake-process-group: $RANK must be in [0, $WORLD_SIZE) = [0, 4), found 4");
  }
  {
    ScopedEnv size("WORLD_SIZE", "eight");
    StatusOr<Comm> w = init_fake_world();
    ASSERT_FALSE(w.ok());
    EXPECT_EQ(w.status().message(), "--fake-process-group: $WORLD_SIZE must be an integer, found 'eight'");
  }
  {
    ScopedEnv size("WORLD_SIZE", "0");
    StatusOr<Comm> w = init_fake_world();
    ASSERT_FALSE(w.ok());
    EXPECT_EQ(w.status().message(), "--fake-process-group: $WORLD_SIZE must be a positive number of ranks, found 0");
  }
  {
    ScopedEnv mpi("OMPI_COMM_WORLD_SIZE", "2");
    StatusOr<Comm> w = init_fake_world();
    ASSERT_FALSE(w.ok());
    EXPECT_NE(w.status().message().find("expected a single process started without mpirun/srun"), std::string::npos)
        << w.status().message();
  }
}

}  // namespace
}  // namespace gale
