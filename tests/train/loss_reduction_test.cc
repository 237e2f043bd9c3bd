// LossReduction (train/loss_reduction.h): the logged loss summed over data-parallel ranks, blocking
// or, with --async-log-allreduce, issued at start and completed at finish — on a fake two-rank group
// whose all-reduce lands only when waited for, so a sum read before the wait shows.
#include "train/loss_reduction.h"

#include <gtest/gtest.h>

#include <array>
#include <vector>

#include "core/check.h"

namespace gale {
namespace {

// A member of a two-rank group whose partner holds `partner`: an all-reduce adds it to the buffer
// when its Work is waited for (not before); a broadcast from the other rank writes `partner` and
// records what the buffer held when it was issued. Nothing else is used.
class DeferredPair : public Communicator {
 public:
  DeferredPair(int rank, std::array<double, 2> partner) : rank_(rank), partner_(partner) {}
  int rank() const override { return rank_; }
  int size() const override { return 2; }
  const std::vector<int>& world_ranks() const override { return ranks_; }
  const std::string& name() const override { return name_; }
  const char* backend() const override { return "deferred"; }

  WorkPtr all_reduce_async(void* buf, int64_t count, DType dtype, ReduceOp op) override {
    GALE_CHECK(count == 2 && dtype == DType::kF64 && op == ReduceOp::kSum);
    auto work = std::make_shared<Deferred>(static_cast<double*>(buf), partner_);
    issued.push_back(work);
    return work;
  }
  WorkPtr broadcast_async(void* buf, int64_t count, DType dtype, int root) override {
    GALE_CHECK(count == 2 && dtype == DType::kF64);
    double* d = static_cast<double*>(buf);
    broadcast_saw = {d[0], d[1]};
    if (root != rank_) d[0] = partner_[0], d[1] = partner_[1];
    ++broadcasts;
    return completed_work();
  }
  WorkPtr reduce_scatter_async(const void*, void*, int64_t, DType, ReduceOp) override { return unused(); }
  WorkPtr all_gather_async(const void*, void*, int64_t, DType) override { return unused(); }
  WorkPtr send_async(const void*, int64_t, DType, int, int) override { return unused(); }
  WorkPtr recv_async(void*, int64_t, DType, int, int) override { return unused(); }
  WorkPtr all_to_all_async(const void*, void*, int64_t, DType) override { return unused(); }
  WorkPtr all_to_allv_async(const void*, const std::vector<int64_t>&, const std::vector<int64_t>&, void*,
                            const std::vector<int64_t>&, const std::vector<int64_t>&, DType) override {
    return unused();
  }
  void barrier() override { unused(); }
  Comm make_group(const std::vector<int>&, const std::string&) override {
    unused();
    return nullptr;
  }

  struct Deferred : Work {
    Deferred(double* buf, std::array<double, 2> add) : buf(buf), add(add) {}
    void wait() override {
      if (done) return;
      buf[0] += add[0];
      buf[1] += add[1];
      done = true;
    }
    bool test() override { return done; }
    double* buf;
    std::array<double, 2> add;
    bool done = false;
  };
  std::vector<std::shared_ptr<Deferred>> issued;
  std::array<double, 2> broadcast_saw{};
  int broadcasts = 0;

 private:
  static WorkPtr unused() {
    GALE_CHECK(false) << "not used by LossReduction";
    return nullptr;
  }
  int rank_;
  std::array<double, 2> partner_;
  std::vector<int> ranks_ = {0, 1};
  std::string name_ = "dp";
};

TEST(LossReduction, BlockingSumsAtStart) {
  DeferredPair dp(0, {2.25, 30.0});
  LossReduction r = LossReduction::start(&dp, 1.5, 10.0, /*async=*/false);
  ASSERT_EQ(dp.issued.size(), 1u);
  EXPECT_TRUE(dp.issued[0]->done);  // the blocking form waited
  r.finish(nullptr);
  EXPECT_EQ(r.loss_sum(), 3.75);
  EXPECT_EQ(r.tokens(), 40.0);
}

TEST(LossReduction, AsyncIssuesAtStartAndWaitsAtFinish) {
  DeferredPair dp(1, {2.25, 30.0});
  LossReduction r = LossReduction::start(&dp, 1.5, 10.0, /*async=*/true);
  ASSERT_EQ(dp.issued.size(), 1u);   // issued at once ...
  EXPECT_FALSE(dp.issued[0]->done);  // ... and still in flight: the optimizer step runs here
  LossReduction moved = std::move(r);  // the buffer in flight does not move with the object
  r = LossReduction();
  moved.finish(nullptr);
  EXPECT_TRUE(dp.issued[0]->done);
  EXPECT_EQ(moved.loss_sum(), 3.75);  // the data-parallel sums, not this rank's 1.5 and 10
  EXPECT_EQ(moved.tokens(), 40.0);
}

TEST(LossReduction, PipelineStagesGetTheLastStagesSumsAfterTheWait) {
  DeferredPair dp(0, {2.25, 30.0});
  DeferredPair pp(1, {0.0, 0.0});  // this rank is the last stage (rank 1 of 2): it broadcasts
  LossReduction last = LossReduction::start(&dp, 1.5, 10.0, /*async=*/true);
  last.finish(&pp);
  EXPECT_EQ(pp.broadcasts, 1);
  EXPECT_EQ(pp.broadcast_saw, (std::array<double, 2>{3.75, 40.0}));  // broadcast the reduced sums
  EXPECT_EQ(last.loss_sum(), 3.75);

  DeferredPair dp0(0, {0.0, 0.0});            // a first stage holds no loss ...
  DeferredPair pp0(0, {3.75, 40.0});          // ... and receives the last stage's
  LossReduction first = LossReduction::start(&dp0, 0.0, 0.0, /*async=*/true);
  first.finish(&pp0);
  EXPECT_EQ(first.loss_sum(), 3.75);
  EXPECT_EQ(first.tokens(), 40.0);
}

TEST(LossReduction, NoCommunicationWithoutDataParallelism) {
  LossReduction r = LossReduction::start(nullptr, 1.5, 10.0, /*async=*/true);
  r.finish(nullptr);
  EXPECT_EQ(r.loss_sum(), 1.5);
  EXPECT_EQ(r.tokens(), 10.0);
}

}  // namespace
}  // namespace gale
