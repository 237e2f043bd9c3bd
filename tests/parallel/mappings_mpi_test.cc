// Tensor/sequence-parallel mappings: each forward matches a serial computation, and each
// forward/backward pair is adjoint across ranks, <f(x), y> = <x, f*(y)>, with random x and y.
// Inner products follow what each tensor means across the TP group: a *replicated* tensor (the
// same on every TP rank) counts once; a *distributed* one (shards, or per-rank partial values)
// counts as the sum over ranks. Run under mpirun with 2 and 4 ranks, on TP groups of the whole
// world and, with 4 ranks, on two TP groups of 2 (tests/parallel/CMakeLists.txt).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "core/rng.h"
#include "mpi_test_env.h"
#include "parallel/mappings.h"
#include "parallel/parallel_state.h"

namespace gale {
namespace {

constexpr int64_t S = 8, B = 3, H = 12;  // S and H divide by 1, 2 and 4

// Random tensors: replicated ones use a seed shared by the TP group, distributed ones a seed
// that also depends on the world rank.
Tensor random_tensor(const Shape& shape, uint64_t stream, int rank_or_minus1) {
  Tensor t = Tensor::empty(shape);
  fill_normal(t.data<float>(), t.numel(), 0.0f, 1.0f, /*seed=*/1234, mix_stream(stream, rank_or_minus1 + 1), 0);
  return t;
}
Tensor replicated(const Shape& shape, uint64_t stream) { return random_tensor(shape, stream, -1); }
Tensor distributed(const Shape& shape, uint64_t stream, int world_rank) {
  return random_tensor(shape, stream, world_rank);
}

double dot(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  double s = 0.0;
  for (int64_t i = 0; i < a.numel(); ++i) s += static_cast<double>(a.data<float>()[i]) * b.data<float>()[i];
  return s;
}

enum class Space { kReplicated, kDistributed };

double inner(const Tensor& a, const Tensor& b, Space space, Communicator& tp) {
  double local = dot(a, b);
  return space == Space::kReplicated ? local : tp.all_reduce_scalar(local);
}

// Checks <f(x), y> = <x, f*(y)> with x in `in_space` of shape `in_shape`, y in `out_space`.
void expect_adjoint(const char* name, Communicator& tp, int world_rank, const Shape& in_shape, Space in_space,
                    const Shape& out_shape, Space out_space, const std::function<Tensor(const Tensor&)>& f,
                    const std::function<Tensor(const Tensor&)>& f_adjoint) {
  for (uint64_t trial = 0; trial < 3; ++trial) {
    Tensor x = in_space == Space::kReplicated ? replicated(in_shape, 10 + trial)
                                              : distributed(in_shape, 10 + trial, world_rank);
    Tensor y = out_space == Space::kReplicated ? replicated(out_shape, 20 + trial)
                                               : distributed(out_shape, 20 + trial, world_rank);
    Tensor fx = f(x.clone());  // clones: all-reduces work in place
    Tensor fty = f_adjoint(y.clone());
    ASSERT_EQ(fx.shape(), out_shape) << name;
    ASSERT_EQ(fty.shape(), in_shape) << name;
    double lhs = inner(fx, y, out_space, tp);
    double rhs = inner(x, fty, in_space, tp);
    EXPECT_GT(std::fabs(lhs), 1e-3) << name << ": a trivial inner product proves nothing";
    EXPECT_NEAR(lhs, rhs, 1e-5 * (std::fabs(lhs) + 1.0)) << name << " trial " << trial;
  }
}

// The TP groups under test: the whole world, and (with 4 ranks) TP = 2 inside a 2x2 layout.
std::vector<ParallelState> layouts() {
  Comm w = test::world();
  std::vector<ParallelState> out;
  for (int tp : {w->size(), 2}) {
    if (tp > w->size() || w->size() % tp != 0) continue;
    if (!out.empty() && tp == w->size()) continue;
    ParallelSizes s;
    s.world_size = w->size();
    s.tp = tp;
    StatusOr<RankLayout> l = compute_rank_layout(s);
    EXPECT_TRUE(l.ok());
    out.push_back(ParallelState::create(w, l.value()));
  }
  return out;
}

TEST(Mappings, AdjointPairs) {
  for (const ParallelState& ps : layouts()) {
    Communicator& tp = *ps.tp();
    const int n = tp.size(), r = ps.world_rank();
    SCOPED_TRACE(::testing::Message() << "TP group of " << n);
    const Shape full = {S, B, H}, h_shard = {S, B, H / n}, s_shard = {S / n, B, H};
    auto D = Space::kDistributed, R = Space::kReplicated;
    expect_adjoint(
        "copy_to_tp_region", tp, r, full, R, full, D, [&](const Tensor& x) { return copy_to_tp_region(x, tp); },
        [&](const Tensor& y) { return copy_to_tp_region_backward(y, tp); });
    expect_adjoint(
        "reduce_from_tp_region", tp, r, full, D, full, R, [&](const Tensor& x) { return reduce_from_tp_region(x, tp); },
        [&](const Tensor& y) { return reduce_from_tp_region_backward(y, tp); });
    expect_adjoint(
        "scatter_to_tp_region", tp, r, full, R, h_shard, D,
        [&](const Tensor& x) { return scatter_to_tp_region(x, tp); },
        [&](const Tensor& y) { return scatter_to_tp_region_backward(y, tp); });
    expect_adjoint(
        "gather_from_tp_region", tp, r, h_shard, D, full, R,
        [&](const Tensor& x) { return gather_from_tp_region(x, tp); },
        [&](const Tensor& y) { return gather_from_tp_region_backward(y, tp); });
    expect_adjoint(
        "scatter_to_sequence_parallel_region", tp, r, full, R, s_shard, D,
        [&](const Tensor& x) { return scatter_to_sequence_parallel_region(x, tp); },
        [&](const Tensor& y) { return scatter_to_sequence_parallel_region_backward(y, tp); });
    // The all-gathered output feeds TP-partial consumers: its gradient is distributed.
    expect_adjoint(
        "gather_from_sequence_parallel_region", tp, r, s_shard, D, full, D,
        [&](const Tensor& x) { return gather_from_sequence_parallel_region(x, tp); },
        [&](const Tensor& y) { return gather_from_sequence_parallel_region_backward(y, tp); });
    // ... or every rank holds the same full gradient: the backward is a split.
    expect_adjoint(
        "gather_from_sequence_parallel_region (replicated grad)", tp, r, s_shard, D, full, R,
        [&](const Tensor& x) { return gather_from_sequence_parallel_region(x, tp); },
        [&](const Tensor& y) { return gather_from_sequence_parallel_region_backward(y, tp, false); });
    expect_adjoint(
        "reduce_scatter_to_sequence_parallel_region", tp, r, full, D, s_shard, D,
        [&](const Tensor& x) { return reduce_scatter_to_sequence_parallel_region(x, tp); },
        [&](const Tensor& y) { return reduce_scatter_to_sequence_parallel_region_backward(y, tp); });
    // The async forms are the same maps.
    expect_adjoint(
        "async sequence-parallel pair", tp, r, s_shard, D, full, D,
        [&](const Tensor& x) { return gather_from_sequence_parallel_region_async(x, tp).wait(); },
        [&](const Tensor& y) { return gather_from_sequence_parallel_region_backward_async(y, tp).wait(); });
    expect_adjoint(
        "async reduce-scatter pair", tp, r, full, D, s_shard, D,
        [&](const Tensor& x) { return reduce_scatter_to_sequence_parallel_region_async(x, tp).wait(); },
        [&](const Tensor& y) { return reduce_scatter_to_sequence_parallel_region_backward_async(y, tp).wait(); });
    expect_adjoint(
        "async all-reduce pair", tp, r, full, R, full, D, [&](const Tensor& x) { return copy_to_tp_region(x, tp); },
        [&](const Tensor& y) { return copy_to_tp_region_backward_async(y, tp).wait(); });
  }
}

// Forward values against a serial computation: every rank regenerates its peers' inputs.
TEST(Mappings, ForwardMatchesSerialComputation) {
  for (const ParallelState& ps : layouts()) {
    Communicator& tp = *ps.tp();
    const int n = tp.size(), me = tp.rank();
    const std::vector<int>& peers = tp.world_ranks();
    SCOPED_TRACE(::testing::Message() << "TP group of " << n);
    auto peer_input = [&](const Shape& shape, int g) { return distributed(shape, 77, peers[g]); };
    // gather along H: out[s,b,g*H/n + j] = input_g[s,b,j]
    Tensor gathered = gather_from_tp_region(peer_input({S, B, H / n}, me), tp);
    for (int g = 0; g < n; ++g) {
      Tensor in = peer_input({S, B, H / n}, g);
      for (int64_t row = 0; row < S * B; ++row)
        for (int64_t j = 0; j < H / n; ++j)
          ASSERT_EQ(gathered.data<float>()[row * H + g * (H / n) + j], in.data<float>()[row * (H / n) + j]);
    }
    // scatter along H takes this rank's columns
    Tensor full = replicated({S, B, H}, 5);
    Tensor part = scatter_to_tp_region(full, tp);
    for (int64_t row = 0; row < S * B; ++row)
      for (int64_t j = 0; j < H / n; ++j)
        ASSERT_EQ(part.data<float>()[row * (H / n) + j], full.data<float>()[row * H + me * (H / n) + j]);
    // sequence gather: block g of dim 0 is rank g's input
    Tensor seq = gather_from_sequence_parallel_region(peer_input({S / n, B, H}, me), tp);
    for (int g = 0; g < n; ++g) {
      Tensor in = peer_input({S / n, B, H}, g);
      for (int64_t i = 0; i < in.numel(); ++i) ASSERT_EQ(seq.data<float>()[g * in.numel() + i], in.data<float>()[i]);
    }
    // reduce-scatter: this rank's block of the sum over ranks
    Tensor rs = reduce_scatter_to_sequence_parallel_region(peer_input({S, B, H}, me), tp);
    ASSERT_EQ(rs.shape(), (Shape{S / n, B, H}));
    for (int64_t i = 0; i < rs.numel(); ++i) {
      float sum = 0.0f;
      for (int g = 0; g < n; ++g) sum += peer_input({S, B, H}, g).data<float>()[me * rs.numel() + i];
      ASSERT_NEAR(rs.data<float>()[i], sum, 1e-5f * (std::fabs(sum) + 1.0f));
    }
    // all-reduce in place returns the same storage
    Tensor x = peer_input({S, B, H}, me);
    Tensor y = reduce_from_tp_region(x, tp);
    EXPECT_EQ(y.raw(), x.raw());
    // sequence split is a view of this rank's rows
    Tensor view = scatter_to_sequence_parallel_region(full, tp);
    EXPECT_EQ(view.raw(), full.slice(me * (S / n), S / n).raw());
  }
}

TEST(Mappings, Bf16ReduceScatterAndGather) {
  for (const ParallelState& ps : layouts()) {
    Communicator& tp = *ps.tp();
    const int n = tp.size(), me = tp.rank();
    auto input = [&](int g) {
      Tensor t = Tensor::empty({S, B, H}, DType::kBF16);
      for (int64_t i = 0; i < t.numel(); ++i)
        t.data<bf16>()[i] = float_to_bf16(0.25f * static_cast<float>((i * 5 + tp.world_ranks()[g]) % 13) - 1.0f);
      return t;
    };
    Tensor rs = reduce_scatter_to_sequence_parallel_region(input(me), tp);
    ASSERT_EQ(rs.dtype(), DType::kBF16);
    for (int64_t i = 0; i < rs.numel(); ++i) {
      float sum = 0.0f;
      for (int g = 0; g < n; ++g) sum += bf16_to_float(input(g).data<bf16>()[me * rs.numel() + i]);
      ASSERT_EQ(rs.data<bf16>()[i].bits, float_to_bf16(sum).bits);
    }
    Tensor back = reduce_scatter_to_sequence_parallel_region_backward(rs, tp);
    ASSERT_EQ(back.shape(), (Shape{S, B, H}));
  }
}

}  // namespace
}  // namespace gale
