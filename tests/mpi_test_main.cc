// GoogleTest main for *_mpi_test.cc programs started under mpirun (see mpi_test.cmake).
//
// Every rank runs every test. Rank 0 prints GoogleTest's report; other ranks print only their
// failures, prefixed with their rank. At the end the ranks agree (an all-reduce) on whether any
// rank failed, and every rank exits non-zero if one did. A rank stuck in a collective because a
// peer returned early from a failed ASSERT is caught by the watchdog (GALE_TEST_TIMEOUT_SECONDS,
// default 120 s), which aborts the whole job non-zero.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

#include "mpi_test_env.h"

namespace {

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?", r.line_number(),
                 r.summary());
    std::fflush(stderr);
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  gale::Comm world = gale::test::world();
  double timeout = 120.0;
  if (const char* t = std::getenv("GALE_TEST_TIMEOUT_SECONDS")) timeout = std::atof(t);
  gale::set_distributed_timeout(timeout);
  if (world->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(world->rank()));
  }
  int64_t failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int64_t any_failed = world->all_reduce_scalar(failed, gale::ReduceOp::kMax);
  if (world->rank() == 0 && any_failed && !failed)
    std::fprintf(stderr, "FAILED on another rank (see [rank N] lines)\n");
  return any_failed ? 1 : 0;
}
