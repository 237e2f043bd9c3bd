// Chunked TP compute-over-communication (parallel/coc.h via model/tp_linear.h) against the plain
// mappings: column- and row-parallel linears, forward (output) and backward (input gradient and
// weight gradient), with and without sequence parallelism, f32 and bf16, 2 to 8 chunks over row
// counts that do not divide by them (and fewer rows than chunks); the bytes each rank passes to the
// TP group are the same and the message count grows with the chunks. Run with 2 and 4 ranks (the
// TP group is the world). Tolerance: 1e-5·(1 + √K) relative to the largest magnitude, the GEMM
// row-split tolerance of
// tests/kernels/cpu/gemm_partitioned_test.cc. The gathered input and the weight gradients (one GEMM
// over the same whole rows in both paths) must be identical. Also --use-ascend-mc2's re-gathering
// column-parallel linear against the plain one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/rng.h"
#include "kernels/cpu/gemm.h"
#include "model/linear.h"
#include "model/tp_linear.h"
#include "mpi_test_env.h"
#include "parallel/coc.h"

namespace gale {
namespace {

Tensor random_rows(int64_t rows, int64_t cols, uint64_t stream) {
  Tensor t = Tensor::empty({rows, cols});
  fill_normal(t.data<float>(), t.numel(), 0.0f, 1.0f, /*seed=*/77, mix_stream(stream, test::world()->rank() + 1), 0);
  return t;
}

// A weight [out, in] with its bf16 copy and a zeroed gradient.
struct TestWeight {
  Tensor w, w16, grad;
  TestWeight(int64_t out, int64_t in, uint64_t stream) {
    w = random_rows(out, in, stream);
    w16 = to_gemm_input(w, DType::kBF16);
    grad = Tensor::zeros({out, in});
  }
  LinearWeight view() {
    LinearWeight v;
    v.w = w.data<float>();
    v.w_bf16 = w16.data<bf16>();
    v.grad = grad.data<float>();
    v.out = w.size(0);
    v.in = w.size(1);
    return v;
  }
};

// Weight gradients are one GEMM over the same whole rows in both paths: identical.
void expect_identical(const Tensor& chunked, const Tensor& plain, const std::string& what) {
  ASSERT_EQ(chunked.shape(), plain.shape()) << what;
  EXPECT_EQ(0, std::memcmp(chunked.raw(), plain.raw(), plain.numel() * dtype_size(plain.dtype()))) << what;
}

void expect_same(const Tensor& chunked, const Tensor& plain, int64_t K, const std::string& what) {
  ASSERT_EQ(chunked.shape(), plain.shape()) << what;
  const float* a = chunked.data<float>();
  const float* b = plain.data<float>();
  // No bit-for-bit branch: on the 2026-12-02 VM (AVX-512) oneDNN's sgemm on fewer rows differed
  // from the whole product in the last bit, so gemm_split_bit_exact() is not a guarantee here.
  float scale = 0.0f;
  for (int64_t i = 0; i < plain.numel(); ++i) scale = std::max(scale, std::fabs(b[i]));
  const double tol = 1e-5 * (1.0 + std::sqrt(static_cast<double>(K))) * std::max(1.0f, scale);
  for (int64_t i = 0; i < plain.numel(); ++i) ASSERT_NEAR(a[i], b[i], tol) << what << " element " << i;
}

struct Case {
  bool sp;
  DType dtype;
  int64_t Tl;  // rows per rank (SP) or rows / TP
};

// One linear of each kind run plain (chunks 1) and chunked with `chunks`; outputs, input gradients,
// weight gradients and the group's byte counts compared.
void check_case(const Case& c, int chunks) {
  Communicator& tp = *test::world();
  const int64_t n = tp.size(), T = c.Tl * n, in = 12, out = 10;
  const std::string what = std::string(c.sp ? "sp" : "no-sp") + (c.dtype == DType::kBF16 ? " bf16" : " f32") +
                           " Tl=" + std::to_string(c.Tl) + " chunks=" + std::to_string(chunks);
  // Column-parallel: input [Tl or T, in] (replicated without SP: one stream for every rank).
  const int64_t col_rows = c.sp ? c.Tl : T;
  Tensor x = c.sp ? random_rows(col_rows, in, 1) : Tensor::empty({T, in});
  if (!c.sp) fill_normal(x.data<float>(), x.numel(), 0.0f, 1.0f, 77, 5, 0);  // the same input on every rank
  x = to_gemm_input(x, c.dtype);
  Tensor dy_col = random_rows(T, out, 2);
  // Row-parallel: input [T, in/TP slice], output gradient [Tl or T, out].
  Tensor x_row = to_gemm_input(random_rows(T, in, 3), c.dtype);
  Tensor dy_row = c.sp ? random_rows(c.Tl, out, 4) : Tensor::empty({T, out});
  if (!c.sp) fill_normal(dy_row.data<float>(), dy_row.numel(), 0.0f, 1.0f, 77, 6, 0);  // replicated

  struct Result {
    Tensor y_col, x_full, dx_col, grad_col, y_row, dx_row, grad_row;
    int64_t bytes = 0, calls = 0;
  };
  auto run = [&](int k) {
    TestWeight wc(out, in, 10), wr(out, in, 11);
    LinearWeight vc = wc.view(), vr = wr.view();
    TpLinearComm comm{&tp, c.sp, k};
    tp.reset_stats();
    Result r;
    r.y_col = column_parallel_linear_forward(comm, x, vc, &r.x_full);
    r.dx_col = column_parallel_linear_backward(comm, dy_col, r.x_full, vc);
    r.y_row = row_parallel_linear_forward(comm, x_row, vr);
    r.dx_row = row_parallel_linear_backward(comm, dy_row.clone(), x_row, vr);
    r.grad_col = wc.grad;
    r.grad_row = wr.grad;
    r.bytes = tp.stats().total_bytes();
    r.calls = tp.stats().total_calls();
    return r;
  };
  const Result plain = run(1), chunked = run(chunks);
  expect_identical(chunked.x_full, plain.x_full, what + " gathered input");
  expect_same(chunked.y_col, plain.y_col, in, what + " column forward");
  expect_same(chunked.dx_col, plain.dx_col, out, what + " column input gradient");
  expect_identical(chunked.grad_col, plain.grad_col, what + " column weight gradient");
  expect_same(chunked.y_row, plain.y_row, in, what + " row forward");
  expect_same(chunked.dx_row, plain.dx_row, out, what + " row input gradient");
  expect_identical(chunked.grad_row, plain.grad_row, what + " row weight gradient");
  EXPECT_EQ(chunked.bytes, plain.bytes) << what << ": bytes passed to the TP group";
  // Plain: SP 4 collectives (gather, reduce-scatter, reduce-scatter, gather); no SP 2 all-reduces.
  const int64_t per_chunk = std::min<int64_t>(chunks, c.sp ? c.Tl : T);
  EXPECT_EQ(plain.calls, c.sp ? 4 : 2) << what;
  EXPECT_EQ(chunked.calls, (c.sp ? 4 : 2) * per_chunk) << what << ": one collective per chunk";
}

// --use-ascend-mc2's column-parallel linear under SP (TpLinearComm::regather_input) against the
// plain one: it keeps x itself, not the gathered rows; its output is the chunked path's; its input
// and weight gradients are the same GEMMs and reduce-scatter as the plain path (identical); the TP
// group passes one more all-gather of x.
void check_regather(DType dtype, int64_t Tl, int chunks) {
  Communicator& tp = *test::world();
  const int64_t T = Tl * tp.size(), in = 12, out = 10;
  const std::string what = std::string(dtype == DType::kBF16 ? "bf16" : "f32") + " Tl=" + std::to_string(Tl) +
                           " chunks=" + std::to_string(chunks);
  const Tensor x = to_gemm_input(random_rows(Tl, in, 1), dtype);
  const Tensor dy = random_rows(T, out, 2);
  struct Result {
    Tensor y, saved, dx, grad;
    int64_t bytes = 0;
  };
  auto run = [&](const TpLinearComm& comm) {
    TestWeight w(out, in, 10);
    LinearWeight v = w.view();
    tp.reset_stats();
    Result r;
    r.y = column_parallel_linear_forward(comm, x, v, &r.saved);
    r.dx = column_parallel_linear_backward(comm, dy, r.saved, v);
    r.grad = w.grad;
    r.bytes = tp.stats().total_bytes();
    return r;
  };
  const Result plain = run(TpLinearComm{&tp, true, 1}), mc2 = run(TpLinearComm{&tp, true, chunks, true});
  ASSERT_TRUE((TpLinearComm{&tp, true, chunks, true}.keeps_local_input()));
  expect_identical(mc2.saved, x, what + " kept input (this rank's rows)");
  EXPECT_EQ(plain.saved.size(0), T) << what << ": the plain path keeps the gathered rows";
  if (chunks == 1)
    expect_identical(mc2.y, plain.y, what + " forward");
  else
    expect_same(mc2.y, plain.y, in, what + " forward");
  expect_identical(mc2.dx, plain.dx, what + " input gradient");
  expect_identical(mc2.grad, plain.grad, what + " weight gradient");
  tp.reset_stats();
  Tensor gathered = Tensor::empty({T, in}, dtype);
  tp.all_gather(x.raw(), gathered.raw(), x.numel(), dtype);
  EXPECT_EQ(mc2.bytes, plain.bytes + tp.stats().total_bytes()) << what << ": one more all-gather of x";
}

TEST(Mc2RegatheringColumnLinear, MatchesPlain) {
  for (DType dtype : {DType::kF32, DType::kBF16})
    for (int64_t Tl : {8, 5})
      for (int chunks : {1, 2, 3}) check_regather(dtype, Tl, chunks);
  // Without sequence parallelism or at TP 1 there is nothing to gather again.
  EXPECT_FALSE((TpLinearComm{test::world().get(), false, 2, true}.keeps_local_input()));
}

TEST(CocRowChunks, BalancedAndNeverEmpty) {
  using Parts = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(coc_row_chunks(8, 4), (Parts{{0, 2}, {2, 2}, {4, 2}, {6, 2}}));
  EXPECT_EQ(coc_row_chunks(7, 4), (Parts{{0, 2}, {2, 2}, {4, 2}, {6, 1}}));
  EXPECT_EQ(coc_row_chunks(10, 4), (Parts{{0, 3}, {3, 3}, {6, 2}, {8, 2}}));
  EXPECT_EQ(coc_row_chunks(3, 8), (Parts{{0, 1}, {1, 1}, {2, 1}}));
  EXPECT_EQ(coc_row_chunks(5, 1), (Parts{{0, 5}}));
}

class CocMatchesPlain : public ::testing::TestWithParam<int> {};

TEST_P(CocMatchesPlain, SequenceParallelF32) {
  for (int64_t Tl : {8, 7, 3}) check_case({true, DType::kF32, Tl}, GetParam());
}
TEST_P(CocMatchesPlain, SequenceParallelBf16) {
  for (int64_t Tl : {6, 5}) check_case({true, DType::kBF16, Tl}, GetParam());
}
TEST_P(CocMatchesPlain, AllReduceF32) {
  for (int64_t Tl : {4, 3, 1}) check_case({false, DType::kF32, Tl}, GetParam());
}
TEST_P(CocMatchesPlain, AllReduceBf16) { check_case({false, DType::kBF16, 5}, GetParam()); }

INSTANTIATE_TEST_SUITE_P(Chunks, CocMatchesPlain, ::testing::Values(2, 3, 4, 8),
                         [](const auto& info) { return "x" + std::to_string(info.param); });

}  // namespace
}  // namespace gale
