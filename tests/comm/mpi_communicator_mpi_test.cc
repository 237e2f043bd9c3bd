// Every MPI collective (blocking and async, on the world and on sub-groups, every dtype) against
// a serial computation of what it must produce; CommStats counts; async overlap with compute.
// Run under mpirun with 1, 2, 4 and 8 ranks (tests/comm/CMakeLists.txt).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <numeric>
#include <type_traits>
#include <vector>

#include "comm/communicator.h"
#include "core/dtype.h"
#include "core/log.h"
#include "mpi_test_env.h"

namespace gale {
namespace {

// A value rank `r` holds at index `i`: small integers and halves, so f32/f64 sums are exact.
double value_at(int r, int64_t i) { return (r + 1) * 0.5 + static_cast<double>((i * 7 + r * 3) % 11) - 5.0; }

template <class T>
std::vector<T> values(int r, int64_t n, int64_t offset = 0) {
  std::vector<T> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    double x = value_at(r, i + offset);
    if constexpr (std::is_integral_v<T>) {
      v[i] = static_cast<T>(std::llround(x * 2.0));
    } else {
      v[i] = static_cast<T>(x);
    }
  }
  return v;
}

template <class T>
T reduce_serial(const std::vector<int>& ranks, int64_t i, ReduceOp op, int64_t offset = 0) {
  T acc{};
  bool first = true;
  for (int r : ranks) {
    T x = values<T>(r, 1, i + offset)[0];
    if (first) {
      acc = x;
    } else if (op == ReduceOp::kSum) {
      acc += x;
    } else if (op == ReduceOp::kMax) {
      acc = std::max(acc, x);
    } else {
      acc = std::min(acc, x);
    }
    first = false;
  }
  return acc;
}

std::vector<int> all_ranks(int n) {
  std::vector<int> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

// The world rank lists of `comm`'s members, by group rank (world rank = global identity).
const std::vector<int>& members(const Comm& c) { return c->world_ranks(); }

// Groups used by the sub-group tests: consecutive pairs [0,1] [2,3] ... (a TP-like group), and
// strided groups {r : r % 2 == k} (a DP-like group), listed in a deliberately reversed order to
// check that group rank i is world_ranks[i].
Comm pair_group(const Comm& world) {
  int r = world->rank();
  int base = r - r % 2;
  std::vector<int> g = {base};
  if (base + 1 < world->size()) g.push_back(base + 1);
  return world->make_group(g, "pair");
}
Comm strided_reversed_group(const Comm& world) {
  std::vector<int> g;
  for (int r = world->size() - 1; r >= 0; --r)
    if (r % 2 == world->rank() % 2) g.push_back(r);
  return world->make_group(g, "strided");
}

std::vector<Comm> groups_under_test() {
  Comm w = test::world();
  return {w, pair_group(w), strided_reversed_group(w)};
}

template <class T>
void check_all_reduce(const Comm& c, ReduceOp op, int64_t n) {
  int me = members(c)[c->rank()];
  std::vector<T> buf = values<T>(me, n);
  c->all_reduce(buf.data(), n, dtype_of<T>(), op);
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(buf[i], reduce_serial<T>(members(c), i, op)) << "group " << c->name() << " element " << i;
}

TEST(MpiCommunicator, WorldMatchesLauncher) {
  Comm w = test::world();
  EXPECT_STREQ(w->backend(), "mpi");
  EXPECT_EQ(w->name(), "world");
  EXPECT_EQ(w->world_ranks(), all_ranks(w->size()));
  EXPECT_GE(w->rank(), 0);
  EXPECT_LT(w->rank(), w->size());
}

TEST(MpiCommunicator, AllReduceEveryDtypeAndOp) {
  for (const Comm& c : groups_under_test()) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
      check_all_reduce<float>(c, op, 1000);
      check_all_reduce<double>(c, op, 37);
      check_all_reduce<int32_t>(c, op, 129);
      check_all_reduce<int64_t>(c, op, 5);
    }
  }
}

TEST(MpiCommunicator, AllReduceBf16IsTheCorrectlyRoundedF32Sum) {
  Comm w = test::world();
  // Rank 0 holds 256, the others 1: a chain of bf16 additions would stay at 256 (each 256+1
  // rounds back to 256); the f32 sum rounded once is what we want.
  const int64_t n = 64;
  std::vector<bf16> buf(n);
  for (int64_t i = 0; i < n; ++i) buf[i] = float_to_bf16(w->rank() == 0 ? 256.0f : 1.0f + 0.0078125f * (i % 4));
  w->all_reduce(buf.data(), n, DType::kBF16);
  for (int64_t i = 0; i < n; ++i) {
    float sum = 256.0f;
    for (int r = 1; r < w->size(); ++r) sum += bf16_to_float(float_to_bf16(1.0f + 0.0078125f * (i % 4)));
    ASSERT_EQ(buf[i].bits, float_to_bf16(sum).bits) << "element " << i;
  }
  if (w->size() == 8) {
    EXPECT_EQ(bf16_to_float(buf[0]), 264.0f);  // 263 rounds to even 264, not 256
  }
  // max over bf16 is exact
  std::vector<bf16> m(3);
  for (int i = 0; i < 3; ++i) m[i] = float_to_bf16(static_cast<float>(w->rank() * (i + 1)) - 1.5f);
  w->all_reduce(m.data(), 3, DType::kBF16, ReduceOp::kMax);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(bf16_to_float(m[i]), static_cast<float>((w->size() - 1) * (i + 1)) - 1.5f);
}

TEST(MpiCommunicator, ScalarHelpers) {
  Comm w = test::world();
  int n = w->size();
  EXPECT_EQ(w->all_reduce_scalar(static_cast<int64_t>(w->rank() + 1)), static_cast<int64_t>(n) * (n + 1) / 2);
  EXPECT_DOUBLE_EQ(w->all_reduce_scalar(0.25 * w->rank(), ReduceOp::kMax), 0.25 * (n - 1));
}

template <class T>
void check_reduce_scatter(const Comm& c, int64_t block, bool in_place) {
  int me = members(c)[c->rank()];
  int n = c->size();
  std::vector<T> send = values<T>(me, block * n);
  std::vector<T> separate(static_cast<size_t>(block));
  T* recv = in_place ? send.data() + c->rank() * block : separate.data();
  c->reduce_scatter(send.data(), recv, block, dtype_of<T>());
  for (int64_t i = 0; i < block; ++i)
    ASSERT_EQ(recv[i], reduce_serial<T>(members(c), c->rank() * block + i, ReduceOp::kSum))
        << "group " << c->name() << " element " << i << (in_place ? " (in place)" : "");
}

TEST(MpiCommunicator, ReduceScatter) {
  for (const Comm& c : groups_under_test()) {
    check_reduce_scatter<float>(c, 333, false);
    check_reduce_scatter<float>(c, 333, true);
    check_reduce_scatter<double>(c, 7, false);
    check_reduce_scatter<int64_t>(c, 9, true);
    check_reduce_scatter<int32_t>(c, 1, false);
  }
}

TEST(MpiCommunicator, ReduceScatterBf16) {
  for (const Comm& c : groups_under_test()) {
    int n = c->size();
    const int64_t block = 50;
    std::vector<bf16> send(block * n);
    for (int64_t i = 0; i < block * n; ++i)
      send[i] = float_to_bf16(static_cast<float>(value_at(members(c)[c->rank()], i)));
    std::vector<bf16> recv(block);
    c->reduce_scatter(send.data(), recv.data(), block, DType::kBF16);
    for (int64_t i = 0; i < block; ++i) {
      float sum = 0.0f;
      for (int r : members(c))
        sum += bf16_to_float(float_to_bf16(static_cast<float>(value_at(r, c->rank() * block + i))));
      ASSERT_EQ(recv[i].bits, float_to_bf16(sum).bits);
    }
  }
}

template <class T>
void check_all_gather(const Comm& c, int64_t block, bool in_place) {
  int me = members(c)[c->rank()];
  int n = c->size();
  std::vector<T> recv(static_cast<size_t>(block * n));
  std::vector<T> mine = values<T>(me, block);
  const T* send = mine.data();
  if (in_place) {
    std::copy(mine.begin(), mine.end(), recv.begin() + c->rank() * block);
    send = recv.data() + c->rank() * block;
  }
  c->all_gather(send, recv.data(), block, dtype_of<T>());
  for (int g = 0; g < n; ++g) {
    std::vector<T> expect = values<T>(members(c)[g], block);
    for (int64_t i = 0; i < block; ++i)
      ASSERT_EQ(recv[g * block + i], expect[i])
          << "group " << c->name() << " block " << g << (in_place ? " (in place)" : "");
  }
}

TEST(MpiCommunicator, AllGather) {
  for (const Comm& c : groups_under_test()) {
    check_all_gather<float>(c, 257, false);
    check_all_gather<float>(c, 257, true);
    check_all_gather<int64_t>(c, 3, false);
    check_all_gather<double>(c, 1, true);
  }
  // bf16 and u16 travel as 16-bit words, bit for bit
  Comm w = test::world();
  std::vector<bf16> mine(5), all(5 * w->size());
  for (int i = 0; i < 5; ++i) mine[i].bits = static_cast<uint16_t>(0x3f80 + w->rank() * 16 + i);
  w->all_gather(mine.data(), all.data(), 5, DType::kBF16);
  for (int r = 0; r < w->size(); ++r)
    for (int i = 0; i < 5; ++i) EXPECT_EQ(all[r * 5 + i].bits, 0x3f80 + r * 16 + i);
}

TEST(MpiCommunicator, BroadcastFromEveryRoot) {
  for (const Comm& c : groups_under_test()) {
    for (int root = 0; root < c->size(); ++root) {
      std::vector<float> buf = values<float>(members(c)[c->rank()], 100);
      c->broadcast(buf.data(), 100, DType::kF32, root);
      EXPECT_EQ(buf, values<float>(members(c)[root], 100)) << "group " << c->name() << " root " << root;
    }
  }
}

TEST(MpiCommunicator, AllToAll) {
  for (const Comm& c : groups_under_test()) {
    int n = c->size(), r = c->rank();
    const int64_t k = 4;
    std::vector<int32_t> send(k * n), recv(k * n);
    for (int d = 0; d < n; ++d)
      for (int64_t i = 0; i < k; ++i) send[d * k + i] = 1000 * r + 10 * d + static_cast<int32_t>(i);  // from r to d
    c->all_to_all(send.data(), recv.data(), k, DType::kI32);
    for (int s = 0; s < n; ++s)
      for (int64_t i = 0; i < k; ++i) ASSERT_EQ(recv[s * k + i], 1000 * s + 10 * r + i) << "group " << c->name();
  }
}

TEST(MpiCommunicator, AllToAllv) {
  Comm w = test::world();
  int n = w->size(), r = w->rank();
  // rank r sends (r + d) % 3 + 1 elements to rank d
  auto amount = [](int from, int to) { return static_cast<int64_t>((from + to) % 3 + 1); };
  std::vector<int64_t> sc(n), sd(n), rc(n), rd(n);
  int64_t st = 0, rt = 0;
  for (int d = 0; d < n; ++d) {
    sc[d] = amount(r, d), sd[d] = st, st += sc[d];
    rc[d] = amount(d, r), rd[d] = rt, rt += rc[d];
  }
  std::vector<float> send(st), recv(rt, -1.0f);
  for (int d = 0; d < n; ++d)
    for (int64_t i = 0; i < sc[d]; ++i) send[sd[d] + i] = 100.0f * r + d + 0.5f * i;
  w->all_to_allv_async(send.data(), sc, sd, recv.data(), rc, rd, DType::kF32)->wait();
  for (int s = 0; s < n; ++s)
    for (int64_t i = 0; i < rc[s]; ++i) ASSERT_EQ(recv[rd[s] + i], 100.0f * s + r + 0.5f * i);
}

TEST(MpiCommunicator, RingSendRecvSmallAndLarge) {
  Comm w = test::world();
  int n = w->size(), r = w->rank();
  if (n == 1) GTEST_SKIP() << "point-to-point needs two ranks";
  for (int64_t count : {int64_t{3}, int64_t{1} << 18}) {  // eager and rendezvous protocols
    std::vector<float> out = values<float>(r, count), in(count);
    // Both directions posted before waiting on either: must not deadlock.
    WorkPtr s = w->send_async(out.data(), count, DType::kF32, (r + 1) % n, 7);
    WorkPtr q = w->recv_async(in.data(), count, DType::kF32, (r - 1 + n) % n, 7);
    q->wait();
    s->wait();
    EXPECT_TRUE(q->test());
    EXPECT_EQ(in, values<float>((r - 1 + n) % n, count));
  }
  // Blocking forms on a sub-group: pair partners exchange (rank 0 of the pair sends first).
  Comm pair = pair_group(w);
  if (pair->size() == 2) {
    int64_t token = 0;
    if (pair->rank() == 0) {
      int64_t mine = 42 + r;
      pair->send(&mine, 1, DType::kI64, 1);
      pair->recv(&token, 1, DType::kI64, 1);
      EXPECT_EQ(token, 2 * mine);
    } else {
      pair->recv(&token, 1, DType::kI64, 0);
      int64_t reply = 2 * token;
      pair->send(&reply, 1, DType::kI64, 0);
    }
  }
}

TEST(MpiCommunicator, BarrierAndNonMemberGroups) {
  Comm w = test::world();
  w->barrier();
  // Only ranks 0 and size-1 form a group (like the embedding group); the others get nullptr.
  std::vector<int> ends = {0};
  if (w->size() > 1) ends.push_back(w->size() - 1);
  bool member = w->rank() == 0 || w->rank() == w->size() - 1;
  Comm g = w->make_group(member ? ends : std::vector<int>{}, "ends");
  EXPECT_EQ(g != nullptr, member);
  if (g) {
    EXPECT_EQ(g->world_ranks(), ends);
    EXPECT_EQ(g->all_reduce_scalar(static_cast<int64_t>(1)), static_cast<int64_t>(ends.size()));
  }
}

// Groups operated on in different orders on different ranks must not deadlock: collectives of
// different groups progress independently (each group has its own thread).
TEST(MpiCommunicator, AsyncOpsOnSeveralGroupsInAnyOrderOverlapCompute) {
  Comm w = test::world();
  Comm pair = pair_group(w);
  Comm strided = strided_reversed_group(w);
  const int64_t n = 1 << 16;
  std::vector<float> a = values<float>(w->rank(), n), b = values<float>(w->rank(), n, 5),
                     c = values<float>(w->rank(), n, 9);
  std::vector<WorkPtr> works;
  if (w->rank() % 2 == 0) {
    works.push_back(pair->all_reduce_async(a.data(), n, DType::kF32, ReduceOp::kSum));
    works.push_back(strided->all_reduce_async(b.data(), n, DType::kF32, ReduceOp::kSum));
  } else {
    works.push_back(strided->all_reduce_async(b.data(), n, DType::kF32, ReduceOp::kSum));
    works.push_back(pair->all_reduce_async(a.data(), n, DType::kF32, ReduceOp::kSum));
  }
  works.push_back(w->all_reduce_async(c.data(), n, DType::kF32, ReduceOp::kMax));
  // Compute while the collectives run (correctness only; timings are in bench/).
  double acc = 0.0;
  std::vector<double> scratch(1 << 14, 1.0);
  for (int it = 0; it < 200; ++it)
    for (double& x : scratch) acc += (x = x * 0.999 + 0.001);
  EXPECT_GT(acc, 0.0);
  for (auto& wk : works) wk->wait();
  for (auto& wk : works) EXPECT_TRUE(wk->test());
  for (int64_t i = 0; i < n; i += 97) {
    ASSERT_EQ(a[i], reduce_serial<float>(members(pair), i, ReduceOp::kSum));
    ASSERT_EQ(b[i], reduce_serial<float>(members(strided), i, ReduceOp::kSum, 5));
    ASSERT_EQ(c[i], reduce_serial<float>(members(w), i, ReduceOp::kMax, 9));
  }
}

TEST(MpiCommunicator, ManyAsyncOpsOnOneGroupCompleteInIssueOrder) {
  Comm w = test::world();
  const int k = 16;
  std::vector<std::vector<int64_t>> bufs(k, std::vector<int64_t>(10));
  std::vector<WorkPtr> works;
  for (int j = 0; j < k; ++j) {
    for (auto& x : bufs[j]) x = j + w->rank();
    works.push_back(w->all_reduce_async(bufs[j].data(), 10, DType::kI64, ReduceOp::kSum));
  }
  works.back()->wait();
  for (int j = 0; j < k; ++j) EXPECT_TRUE(works[j]->test()) << "op " << j << " finished after a later one";
  int64_t n = w->size();
  for (int j = 0; j < k; ++j) EXPECT_EQ(bufs[j][3], j * n + n * (n - 1) / 2);
}

// A blocking collective issued while async ones are queued on the same group runs after them
// (it is not run on the caller's thread ahead of them).
TEST(MpiCommunicator, BlockingCollectiveQueuesBehindAsyncOnes) {
  Comm w = test::world();
  const int64_t big = 1 << 18;
  std::vector<float> a(big, 1.0f);
  std::vector<int64_t> b(4, 2);
  WorkPtr first = w->all_reduce_async(a.data(), big, DType::kF32, ReduceOp::kSum);
  w->all_reduce(b.data(), 4, DType::kI64);
  EXPECT_TRUE(first->test());
  EXPECT_EQ(b[0], 2 * w->size());
  first->wait();
  EXPECT_EQ(a[big - 1], static_cast<float>(w->size()));
}

TEST(MpiCommunicator, StatsCountCallsBytesAndWaitTime) {
  Comm w = test::world();
  Comm pair = pair_group(w);
  int n = w->size();
  w->reset_stats();
  pair->reset_stats();
  std::vector<float> buf(1000, 1.0f), big(1000 * n);
  w->all_reduce(buf.data(), 1000, DType::kF32);
  w->all_reduce(buf.data(), 10, DType::kBF16);  // counts the caller's bf16 bytes
  w->reduce_scatter(big.data(), buf.data(), 1000 / n, DType::kF32);
  w->all_gather(buf.data(), big.data(), 1000, DType::kF32);
  w->broadcast(buf.data(), 7, DType::kF64, 0);
  w->barrier();
  pair->all_reduce(buf.data(), 3, DType::kI32);
  const CommStats& s = w->stats();
  auto idx = [](CommOp op) { return static_cast<int>(op); };
  EXPECT_EQ(s.calls[idx(CommOp::kAllReduce)], 2);
  EXPECT_EQ(s.bytes[idx(CommOp::kAllReduce)], 1000 * 4 + 10 * 2);
  EXPECT_EQ(s.calls[idx(CommOp::kReduceScatter)], 1);
  EXPECT_EQ(s.bytes[idx(CommOp::kReduceScatter)], int64_t{1000 / n} * n * 4);
  EXPECT_EQ(s.bytes[idx(CommOp::kAllGather)], int64_t{1000} * n * 4);
  EXPECT_EQ(s.bytes[idx(CommOp::kBroadcast)], 7 * 8);
  EXPECT_EQ(s.calls[idx(CommOp::kBarrier)], 1);
  EXPECT_EQ(s.bytes[idx(CommOp::kBarrier)], 0);
  EXPECT_EQ(s.total_calls(), 6);
  EXPECT_GE(s.wait_seconds, 0.0);
  // The pair group's counters are its own.
  EXPECT_EQ(pair->stats().total_calls(), 1);
  EXPECT_EQ(pair->stats().total_bytes(), 12);
  if (n > 1) {
    std::vector<float> x(4, 1.0f), y(4);
    WorkPtr s1 = w->send_async(x.data(), 4, DType::kF32, (w->rank() + 1) % n, 1);
    WorkPtr r1 = w->recv_async(y.data(), 4, DType::kF32, (w->rank() + n - 1) % n, 1);
    s1->wait();
    r1->wait();
    EXPECT_EQ(w->stats().bytes[idx(CommOp::kSend)], 16);
    EXPECT_EQ(w->stats().bytes[idx(CommOp::kRecv)], 16);
  }
  w->reset_stats();
  EXPECT_EQ(w->stats().total_calls(), 0);
  EXPECT_EQ(w->stats().wait_seconds, 0.0);
}

// A rank that arrives late makes the others wait: that time is what wait_seconds measures.
TEST(MpiCommunicator, WaitSecondsMeasureTimeBlocked) {
  Comm w = test::world();
  if (w->size() == 1) GTEST_SKIP();
  w->barrier();
  w->reset_stats();
  if (w->rank() == 0) {
    double until = now_seconds() + 0.5;
    while (now_seconds() < until) {
    }
  }
  int64_t x = 1;
  w->all_reduce(&x, 1, DType::kI64);
  if (w->rank() != 0) {
    EXPECT_GT(w->stats().wait_seconds, 0.05);  // ~0.5 s, minus how late this rank left the barrier
  }
  EXPECT_LT(w->stats().wait_seconds, 60.0);
}

}  // namespace
}  // namespace gale
