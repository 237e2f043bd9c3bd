// --tp-2d building blocks under mpirun (2 and 4 ranks, every X x Y grid of the world): the X/Y
// groups, the piece and row/head mappings (each forward against the serial computation and its
// backward as the adjoint, <f(a), b> = <a, f*(b)>), ParallelLinear2D's column and row forms against
// the plain products (output, input gradient, weight gradient), and the distributed norms against
// the reference LayerNorm / RMSNorm kernels on whole rows.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/rng.h"
#include "kernels/cpu/norm.h"
#include "model/tp2d_linear.h"
#include "model/tp2d_norm.h"
#include "mpi_test_env.h"
#include "parallel/tp2d_groups.h"
#include "parallel/tp2d_mappings.h"

namespace gale {
namespace {

// A [rows, cols] tensor of values from a stream shared by every rank (the "global" tensor).
Tensor global_tensor(int64_t rows, int64_t cols, uint64_t stream) {
  Tensor t = Tensor::empty({rows, cols});
  fill_normal(t.data<float>(), t.numel(), 0.0f, 1.0f, /*seed=*/99, stream, 0);
  return t;
}

// Block (rb of nr row blocks, cb of nc column blocks) of `t`, as a new tensor.
Tensor block(const Tensor& t, int64_t nr, int64_t rb, int64_t nc, int64_t cb) {
  const int64_t R = t.size(0) / nr, C = t.size(1) / nc;
  Tensor out = Tensor::empty({R, C});
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c)
      out.data<float>()[r * C + c] = t.data<float>()[(rb * R + r) * t.size(1) + cb * C + c];
  return out;
}

double dot(const Tensor& a, const Tensor& b) {
  double s = 0.0;
  for (int64_t i = 0; i < a.numel(); ++i) s += static_cast<double>(a.data<float>()[i]) * b.data<float>()[i];
  return s;
}

double sum_over_world(double v) { return test::world()->all_reduce_scalar(v, ReduceOp::kSum); }

void expect_near_tensor(const Tensor& a, const Tensor& b, double tol, const char* what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  int64_t bad = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    bad += std::fabs(a.data<float>()[i] - b.data<float>()[i]) > tol * (1.0 + std::fabs(b.data<float>()[i]));
  EXPECT_EQ(bad, 0) << what;
}

// Every X dividing the world size.
std::vector<int64_t> grid_xs() {
  std::vector<int64_t> xs;
  for (int64_t x = 1; x <= test::world()->size(); ++x)
    if (test::world()->size() % x == 0) xs.push_back(x);
  return xs;
}

TEST(Tp2dGroups, MembersFollowMindSpeedsGrid) {
  EXPECT_EQ(tp2d_x_members(4, 2, 3), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(tp2d_y_members(4, 2, 3), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(tp2d_x_members(8, 2, 5), (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(tp2d_y_members(8, 2, 5), (std::vector<int64_t>{1, 3, 5, 7}));
  EXPECT_EQ(tp2d_x_members(4, 4, 1), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(tp2d_y_members(4, 4, 1), (std::vector<int64_t>{1}));
  for (int64_t X : grid_xs()) {
    const Tp2dGroups g = make_tp2d_groups(test::world(), X);
    const int r = test::world()->rank();
    EXPECT_EQ(g.x->size(), X);
    EXPECT_EQ(g.y->size(), test::world()->size() / X);
    EXPECT_EQ(g.x->rank(), r % X);
    EXPECT_EQ(g.y->rank(), r / X);
  }
}

constexpr int64_t T = 24, H = 12;  // divisible by every X, Y of 1, 2, 4

TEST(Tp2dMappings, PieceScatterAndGatherAreAdjoint) {
  for (int64_t X : grid_xs()) {
    const Tp2dGroups g = make_tp2d_groups(test::world(), X);
    const int64_t Y = g.y->size();
    const Tensor full = global_tensor(T, H, 1);
    const Tensor piece = scatter_to_2d_piece(full, *g.x, *g.y);
    expect_near_tensor(piece, block(full, X, g.x->rank(), Y, g.y->rank()), 0.0, "scatter");
    expect_near_tensor(gather_from_2d_piece(piece, *g.x, *g.y), full, 0.0, "gather");
    // <scatter(a), b_piece> summed over ranks = <a, scatter*(b_piece)> (a replicated: counted once).
    const Tensor b = block(global_tensor(T, H, 2 + test::world()->rank()), 1, 0, 1, 0);
    Tensor b_piece = block(b, X, 0, Y, 0);
    const double lhs = sum_over_world(dot(scatter_to_2d_piece(full, *g.x, *g.y), b_piece));
    const double rhs = dot(full, scatter_to_2d_piece_backward(b_piece, *g.x, *g.y)) * 1.0;
    // scatter*'s output is the whole gathered gradient, the same on every rank: counted once.
    EXPECT_NEAR(lhs, rhs, 1e-3 * (1 + std::fabs(lhs))) << "X " << X;
  }
}

TEST(Tp2dMappings, RowsToHeadsIsTheSerialTranspositionAndInverse) {
  const Comm& w = test::world();
  const int64_t n = w->size(), R = 6, W = 4 * n;
  const Tensor global = global_tensor(n * R, W, 3);
  const Tensor mine = block(global, n, w->rank(), 1, 0);
  const Tensor heads = rows_to_heads(mine, *w);
  expect_near_tensor(heads, block(global, 1, 0, n, w->rank()), 0.0, "rows_to_heads");
  expect_near_tensor(heads_to_rows(heads, *w), mine, 0.0, "heads_to_rows");
}

// The forms of ParallelLinear2D: input rows over ag, columns over rs; output rows over rs, columns over ag.
void check_linear_2d(Communicator& ag, Communicator& rs, const char* what) {
  const int64_t a = ag.size(), r = rs.size(), in = 8, out = 12;
  const Tensor x = global_tensor(T, in, 10), w = global_tensor(out, in, 11), dy = global_tensor(T, out, 12);
  Tensor y_ref = Tensor::zeros({T, out}), dx_ref = Tensor::zeros({T, in}), dw_ref = Tensor::zeros({out, in});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) {
        y_ref.data<float>()[t * out + o] += x.data<float>()[t * in + i] * w.data<float>()[o * in + i];
        dx_ref.data<float>()[t * in + i] += dy.data<float>()[t * out + o] * w.data<float>()[o * in + i];
        dw_ref.data<float>()[o * in + i] += dy.data<float>()[t * out + o] * x.data<float>()[t * in + i];
      }
  const Tensor wb = block(w, a, ag.rank(), r, rs.rank());
  Tensor dw = Tensor::zeros(wb.shape());
  LinearWeight lw;
  lw.w = wb.data<float>();
  lw.grad = dw.data<float>();
  lw.out = wb.size(0);
  lw.in = wb.size(1);
  Tensor x_full;
  const Tensor y = linear_2d_forward(block(x, a, ag.rank(), r, rs.rank()), lw, ag, rs, &x_full);
  expect_near_tensor(y, block(y_ref, r, rs.rank(), a, ag.rank()), 1e-5, what);
  const Tensor dx = linear_2d_backward(block(dy, r, rs.rank(), a, ag.rank()), x_full, lw, ag, rs);
  expect_near_tensor(dx, block(dx_ref, a, ag.rank(), r, rs.rank()), 1e-5, what);
  expect_near_tensor(dw, block(dw_ref, a, ag.rank(), r, rs.rank()), 1e-5, what);
}

TEST(Tp2dLinear, ColumnAndRowFormsMatchThePlainProducts) {
  for (int64_t X : grid_xs()) {
    const Tp2dGroups g = make_tp2d_groups(test::world(), X);
    check_linear_2d(*g.x, *g.y, "column form (ag X, rs Y)");
    check_linear_2d(*g.y, *g.x, "row form (ag Y, rs X)");
  }
}

// norm_2d on column slices over the whole world against the reference kernels on whole rows.
void check_norm_2d(bool rms) {
  const Comm& w = test::world();
  const int64_t n = w->size(), R = 5, Hn = 4 * n, j = w->rank();
  Tensor x = global_tensor(R, Hn, 20), dy = global_tensor(R, Hn, 21);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] += 3.0f;  // a mean far from 0
  const Tensor gamma = global_tensor(1, Hn, 22), beta = global_tensor(1, Hn, 23);
  Tensor y_ref = Tensor::empty({R, Hn}), dx_ref = Tensor::empty({R, Hn}), mean = Tensor::empty({R}),
         rstd = Tensor::empty({R});
  Tensor dg_ref = Tensor::zeros({1, Hn}), db_ref = Tensor::zeros({1, Hn});
  if (rms) {
    rmsnorm_forward_ref(x.data<float>(), gamma.data<float>(), y_ref.data<float>(), rstd.data<float>(), R, Hn, 1e-5f);
    rmsnorm_backward_ref(dy.data<float>(), x.data<float>(), gamma.data<float>(), rstd.data<float>(),
                         dx_ref.data<float>(), dg_ref.data<float>(), R, Hn);
  } else {
    layernorm_forward_ref(x.data<float>(), gamma.data<float>(), beta.data<float>(), y_ref.data<float>(),
                          mean.data<float>(), rstd.data<float>(), R, Hn, 1e-5f);
    layernorm_backward_ref(dy.data<float>(), x.data<float>(), gamma.data<float>(), mean.data<float>(),
                           rstd.data<float>(), dx_ref.data<float>(), dg_ref.data<float>(), db_ref.data<float>(), R, Hn);
  }
  const Norm2dSpec spec{rms, 1e-5f, Hn};
  const Tensor xs = block(x, 1, 0, n, j), gs = block(gamma, 1, 0, n, j), bs = block(beta, 1, 0, n, j);
  Tensor stats;
  const Tensor y = norm_2d_forward(spec, xs, gs.data<float>(), rms ? nullptr : bs.data<float>(), *w, &stats);
  expect_near_tensor(y, block(y_ref, 1, 0, n, j), 1e-5, rms ? "rmsnorm forward" : "layernorm forward");
  Tensor dg = Tensor::zeros({1, Hn / n}), db = Tensor::zeros({1, Hn / n});
  const Tensor dx = norm_2d_backward(spec, block(dy, 1, 0, n, j), xs, stats, gs.data<float>(), *w, dg.data<float>(),
                                     rms ? nullptr : db.data<float>());
  expect_near_tensor(dx, block(dx_ref, 1, 0, n, j), 1e-4, rms ? "rmsnorm dx" : "layernorm dx");
  expect_near_tensor(dg, block(dg_ref, 1, 0, n, j), 1e-5, "dgamma");
  if (!rms) expect_near_tensor(db, block(db_ref, 1, 0, n, j), 1e-5, "dbeta");
}

TEST(Tp2dNorm, LayerNormMatchesTheWholeRowKernel) { check_norm_2d(false); }
TEST(Tp2dNorm, RmsNormMatchesTheWholeRowKernel) { check_norm_2d(true); }

}  // namespace
}  // namespace gale
