// Megatron's reduce-scatter with FP32 accumulation under mpirun: exact sums, the fixed rank order,
// bf16 on the wire, and the precision it keeps over a bf16 ring reduce-scatter.
//
// Every rank knows every rank's inputs (they are functions of the rank), so each expected value is
// computed here independently: the float64 sum of the bf16 inputs where the f32 sum is exact, the
// f32 sum in rank order where it is not, and a model of NCCL's bf16 ring (each hop's partial sum
// rounded to bf16) for the comparison.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "comm/reduce_scatter_fp32_accumulation.h"
#include "mpi_test_env.h"

namespace gale {
namespace {

float bf16_round(float x) { return bf16_to_float(float_to_bf16(x)); }

// bf16 values k·2^-e (k < 128, e in [0, 6]): any sum of up to 8 of them is exact in f32 (and in f64).
float small_value(int rank, int64_t j) {
  const int64_t k = (37 * j + 11 * rank + 5) % 127 - 63;
  const int e = static_cast<int>((j + 3 * rank) % 7);
  return std::ldexp(static_cast<float>(k), -e);
}

std::vector<bf16> inputs(int rank, int size, int64_t count, float (*value)(int, int64_t)) {
  std::vector<bf16> v(static_cast<size_t>(size * count));
  for (int64_t j = 0; j < size * count; ++j) v[static_cast<size_t>(j)] = float_to_bf16(value(rank, j));
  return v;
}

TEST(ReduceScatterFp32Accumulation, ExactSumOfBf16InputsAtHalfTheF32Bytes) {
  Comm world = test::world();
  const int n = world->size(), me = world->rank();
  const int64_t count = 37;
  const std::vector<bf16> send = inputs(me, n, count, small_value);
  std::vector<bf16> got(static_cast<size_t>(count)), plain(static_cast<size_t>(count));
  world->reset_stats();
  reduce_scatter_with_fp32_accumulation(*world, send.data(), got.data(), count, DType::kBF16)->wait();
  const CommStats fp32_acc = world->stats();
  world->reset_stats();
  world->reduce_scatter(send.data(), plain.data(), count, DType::kBF16);
  const CommStats ring = world->stats();
  // An all-to-all of bf16: the bytes CommStats counts for the bf16 reduce-scatter, no reduce-scatter.
  EXPECT_EQ(fp32_acc.bytes[static_cast<int>(CommOp::kAllToAll)], n * count * 2);
  EXPECT_EQ(fp32_acc.bytes[static_cast<int>(CommOp::kAllToAll)], ring.bytes[static_cast<int>(CommOp::kReduceScatter)]);
  EXPECT_EQ(fp32_acc.calls[static_cast<int>(CommOp::kReduceScatter)], 0);
  for (int64_t i = 0; i < count; ++i) {
    double exact = 0.0;  // float64, in rank order: the exact sum of the bf16 inputs
    for (int r = 0; r < n; ++r) exact += bf16_to_float(float_to_bf16(small_value(r, me * count + i)));
    ASSERT_EQ(bf16_to_float(got[static_cast<size_t>(i)]), bf16_round(static_cast<float>(exact))) << "element " << i;
    // Gale's MPI bf16 reduce-scatter widens to f32 and rounds once too: on f32-exact sums they agree.
    ASSERT_EQ(bf16_to_float(got[static_cast<size_t>(i)]), bf16_to_float(plain[static_cast<size_t>(i)]));
  }
}

// 2^24, 1, -2^24, 1, ...: the f32 sum depends on the order (2^24 + 1 rounds back to 2^24). The
// result is the f32 sum in rank order, on every rank, rounded to bf16 once; in f32 too.
float spread_value(int rank, int64_t j) {
  switch ((rank + j) % 4) {
    case 0: return 16777216.0f;
    case 2: return -16777216.0f;
    default: return 1.0f;
  }
}

TEST(ReduceScatterFp32Accumulation, SumsInRankOrder) {
  Comm world = test::world();
  const int n = world->size(), me = world->rank();
  const int64_t count = 8;
  const std::vector<bf16> send = inputs(me, n, count, spread_value);
  std::vector<bf16> got(static_cast<size_t>(count));
  reduce_scatter_with_fp32_accumulation(*world, send.data(), got.data(), count, DType::kBF16)->wait();
  std::vector<float> send32(static_cast<size_t>(n * count)), got32(static_cast<size_t>(count));
  for (int64_t j = 0; j < n * count; ++j) send32[static_cast<size_t>(j)] = spread_value(me, j);
  reduce_scatter_with_fp32_accumulation(*world, send32.data(), got32.data(), count, DType::kF32)->wait();
  int order_matters = 0;
  for (int64_t i = 0; i < count; ++i) {
    float forward = 0.0f, backward = 0.0f;
    for (int r = 0; r < n; ++r) forward += spread_value(r, me * count + i);
    for (int r = n; r-- > 0;) backward += spread_value(r, me * count + i);
    ASSERT_EQ(bf16_to_float(got[static_cast<size_t>(i)]), bf16_round(forward)) << "element " << i;
    ASSERT_EQ(got32[static_cast<size_t>(i)], forward) << "element " << i;
    order_matters += forward != backward;
  }
  if (n >= 4) EXPECT_GT(world->all_reduce_scalar(static_cast<int64_t>(order_matters)), 0);
}

// For the shard of rank q the ring starts at rank q+1 with 1.0 and every other rank adds 2^-8: each
// hop's bf16 rounding (1 + 2^-8 is a tie, rounded to the even 1) drops the small addends, whereas the
// f32 sum keeps them and rounds once.
float ring_adversary(int rank, int size, int64_t count, int64_t j) {
  const int q = static_cast<int>(j / count);
  return rank == (q + 1) % size ? 1.0f : 0x1p-8f;
}

TEST(ReduceScatterFp32Accumulation, MoreAccurateThanABf16Ring) {
  Comm world = test::world();
  const int n = world->size(), me = world->rank();
  if (n < 3) GTEST_SKIP() << "a ring of 2 rounds once, as the f32 sum: needs 3 or more ranks";
  const int64_t count = 5;
  std::vector<bf16> send(static_cast<size_t>(n * count));
  for (int64_t j = 0; j < n * count; ++j) send[static_cast<size_t>(j)] = float_to_bf16(ring_adversary(me, n, count, j));
  std::vector<bf16> got(static_cast<size_t>(count));
  reduce_scatter_with_fp32_accumulation(*world, send.data(), got.data(), count, DType::kBF16)->wait();
  for (int64_t i = 0; i < count; ++i) {
    const int64_t j = me * count + i;
    double exact = 0.0;
    for (int r = 0; r < n; ++r) exact += ring_adversary(r, n, count, j);
    // NCCL's ring for this shard: rank q+1 starts, each later hop adds its value and rounds to bf16.
    float ring = ring_adversary((me + 1) % n, n, count, j);
    for (int h = 2; h <= n; ++h) ring = bf16_round(ring + ring_adversary((me + h) % n, n, count, j));
    const float fp32_acc = bf16_to_float(got[static_cast<size_t>(i)]);
    EXPECT_EQ(ring, 1.0f);
    EXPECT_EQ(fp32_acc, bf16_round(static_cast<float>(exact)));
    EXPECT_LT(std::fabs(fp32_acc - exact), std::fabs(ring - exact)) << "element " << i;
    EXPECT_LE(std::fabs(fp32_acc - exact), 0x1p-8 * exact) << "within half a bf16 ulp";
  }
}

// Megatron writes the sum into the rank's own shard of the input: recv inside send.
TEST(ReduceScatterFp32Accumulation, InPlaceIntoTheOwnShard) {
  Comm world = test::world();
  const int n = world->size(), me = world->rank();
  const int64_t count = 11;
  std::vector<bf16> buf = inputs(me, n, count, small_value);
  WorkPtr w = reduce_scatter_with_fp32_accumulation(*world, buf.data(), buf.data() + me * count, count, DType::kBF16);
  w->wait();
  w->wait();  // twice: no second sum
  for (int64_t i = 0; i < count; ++i) {
    double exact = 0.0;
    for (int r = 0; r < n; ++r) exact += small_value(r, me * count + i);
    ASSERT_EQ(bf16_to_float(buf[static_cast<size_t>(me * count + i)]), bf16_round(static_cast<float>(exact)));
  }
}

}  // namespace
}  // namespace gale
