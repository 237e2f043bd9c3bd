// The expert-parallel token exchange (model/moe_dispatch.h) over the whole world as the EP group:
// dispatch delivers every row to the rank owning its expert, grouped by local expert and ordered
// by (source rank, row); the exchanged counts are right; combine returns exactly the input; with
// uneven and zero counts (experts and whole ranks that get no rows), f32 and bf16 rows; the
// while-in-flight hook of --moe-shared-expert-overlap.
#include <gtest/gtest.h>

#include "mpi_test_env.h"
#include "model/linear.h"
#include "model/moe_dispatch.h"

namespace gale {
namespace {

constexpr int64_t H = 3;

// Rows sent by rank `src` to global expert e: a count that is 0 for some experts and whole ranks.
int64_t count_of(int src, int64_t e, int64_t E, int salt) {
  if ((e + salt) % 3 == 0) return 0;            // some experts get nothing
  if (salt == 2 && e < E / 2) return 0;          // a whole EP rank's experts get nothing
  return (src * 7 + e * 3 + salt) % 5;
}

// Row value: identifies (source rank, its row index, column).
float value_of(int src, int64_t row, int64_t h) { return static_cast<float>(src * 10000 + row * 10 + h); }

// `v` as a row of `dtype` holds it (bf16 rounds).
float stored(float v, DType dtype) {
  Tensor t = Tensor::empty({1, 1});
  t.data<float>()[0] = v;
  return to_f32(to_gemm_input(t, dtype)).data<float>()[0];
}

void check_round_trip(const Comm& ep, int64_t El, int salt, DType dtype) {
  const int P = ep->size(), me = ep->rank();
  const int64_t E = El * P;
  std::vector<int64_t> counts(static_cast<size_t>(E));
  int64_t n = 0;
  for (int64_t e = 0; e < E; ++e) n += counts[e] = count_of(me, e, E, salt);
  Tensor rows = Tensor::empty({n, H});
  for (int64_t r = 0; r < n; ++r)
    for (int64_t h = 0; h < H; ++h) rows.data<float>()[r * H + h] = value_of(me, r, h);
  rows = to_gemm_input(rows, dtype);

  const MoeDispatchPlan plan = make_dispatch_plan(ep, counts);
  ASSERT_EQ(plan.local_experts, El);
  ASSERT_EQ(plan.num_sent(), n);
  // Counts: rank s sends count_of(s, me·El + j) rows to local expert j.
  for (int s = 0; s < P; ++s)
    for (int64_t j = 0; j < El; ++j)
      EXPECT_EQ(plan.recv_counts[s * El + j], count_of(s, me * El + j, E, salt)) << "from rank " << s << " expert " << j;

  const Tensor got = to_f32(dispatch_rows(ep, plan, rows));
  ASSERT_EQ(got.size(0), plan.num_received());
  // Expected: for each local expert j, each source s, the rows s holds for global expert me·El + j.
  int64_t at = 0;
  for (int64_t j = 0; j < El; ++j) {
    EXPECT_EQ(plan.expert_offsets[j], at);
    for (int s = 0; s < P; ++s) {
      int64_t first = 0;  // first row of global expert me·El + j in rank s's permuted rows
      for (int64_t e = 0; e < me * El + j; ++e) first += count_of(s, e, E, salt);
      for (int64_t r = 0; r < count_of(s, me * El + j, E, salt); ++r, ++at)
        for (int64_t h = 0; h < H; ++h)
          ASSERT_EQ(got.data<float>()[at * H + h], stored(value_of(s, first + r, h), dtype)) << "expert " << j << " source " << s;
    }
  }
  EXPECT_EQ(plan.expert_offsets[El], at);
  const Tensor back = to_f32(combine_rows(ep, plan, dispatch_rows(ep, plan, rows)));
  ASSERT_EQ(back.size(0), n);
  const Tensor in = to_f32(rows);
  for (int64_t i = 0; i < n * H; ++i) ASSERT_EQ(back.data<float>()[i], in.data<float>()[i]) << i;
}

TEST(MoeDispatch, RoundTripOneExpertPerRank) { check_round_trip(test::world(), 1, 1, DType::kF32); }
TEST(MoeDispatch, RoundTripUnevenCounts) { check_round_trip(test::world(), 3, 1, DType::kF32); }
TEST(MoeDispatch, RoundTripRankWithoutTokens) { check_round_trip(test::world(), 2, 2, DType::kF32); }
TEST(MoeDispatch, RoundTripBf16) { check_round_trip(test::world(), 2, 0, DType::kBF16); }
TEST(MoeDispatch, RoundTripF16) { check_round_trip(test::world(), 2, 0, DType::kF16); }

// --moe-shared-expert-overlap's hook: the callback runs once, on the calling thread, while the row
// exchange is in flight, and may run collectives of another group (the shared expert's TP
// all-gather and reduce-scatter) without disturbing the exchange.
TEST(MoeDispatch, WhileInFlightRunsOnceAndMayUseAnotherGroup) {
  const Comm& ep = test::world();
  std::vector<int> ranks(static_cast<size_t>(ep->size()));
  for (int r = 0; r < ep->size(); ++r) ranks[r] = r;
  const Comm other = ep->make_group(ranks, "other");
  const int64_t E = 2 * ep->size();
  std::vector<int64_t> counts(static_cast<size_t>(E));
  int64_t n = 0;
  for (int64_t e = 0; e < E; ++e) n += counts[e] = count_of(ep->rank(), e, E, 1);
  Tensor rows = Tensor::empty({n, H});
  for (int64_t r = 0; r < n; ++r)
    for (int64_t h = 0; h < H; ++h) rows.data<float>()[r * H + h] = value_of(ep->rank(), r, h);
  const MoeDispatchPlan plan = make_dispatch_plan(ep, counts);
  const Tensor expected = dispatch_rows(ep, plan, rows);
  int calls = 0;
  double sum = 1.0;
  const Tensor got = dispatch_rows(ep, plan, rows, [&] {
    ++calls;
    other->all_reduce(&sum, 1, DType::kF64, ReduceOp::kSum);
  });
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(sum, static_cast<double>(ep->size()));
  ASSERT_EQ(got.numel(), expected.numel());
  for (int64_t i = 0; i < got.numel(); ++i) ASSERT_EQ(got.data<float>()[i], expected.data<float>()[i]) << i;
  int one_rank_calls = 0;  // one EP rank: nothing in flight, the callback still runs
  const Comm self = make_self_communicator("ep");
  const MoeDispatchPlan single = make_dispatch_plan(self, std::vector<int64_t>{n});
  EXPECT_EQ(dispatch_rows(self, single, rows, [&] { ++one_rank_calls; }).numel(), rows.numel());
  EXPECT_EQ(one_rank_calls, 1);
}

}  // namespace
}  // namespace gale
