// Distributed LayerNorm / RMSNorm over column-split rows (model/tp2d_norm.h).
#include "model/tp2d_norm.h"

#include <cmath>
#include <vector>

#include "core/check.h"

namespace gale {

namespace {

// Per-row Σ f(row) over this rank's columns, summed over `g` (in double).
template <typename F>
std::vector<double> row_sums(int64_t rows, Communicator& g, F f) {
  std::vector<double> s(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) s[static_cast<size_t>(r)] = f(r);
  if (g.size() > 1) g.all_reduce(s.data(), rows, DType::kF64, ReduceOp::kSum);
  return s;
}

}  // namespace

Tensor norm_2d_forward(const Norm2dSpec& s, const Tensor& x, const float* gamma, const float* beta, Communicator& g,
                       Tensor* stats) {
  GALE_CHECK(x.dtype() == DType::kF32 && x.ndim() == 2 && x.size(1) * g.size() == s.hidden)
      << "norm_2d: " << x.shape_string() << " is not a column slice of rows of " << s.hidden << " over " << g.size();
  const int64_t rows = x.size(0), cols = x.size(1);
  const float* xd = x.data<float>();
  const double H = static_cast<double>(s.hidden);
  std::vector<double> mean(static_cast<size_t>(rows), 0.0);
  if (!s.rms) {
    mean = row_sums(rows, g, [&](int64_t r) {
      double a = 0.0;
      for (int64_t j = 0; j < cols; ++j) a += xd[r * cols + j];
      return a;
    });
    for (double& m : mean) m /= H;
  }
  const std::vector<double> sq = row_sums(rows, g, [&](int64_t r) {
    double a = 0.0;
    for (int64_t j = 0; j < cols; ++j) {
      const double d = xd[r * cols + j] - mean[static_cast<size_t>(r)];
      a += d * d;
    }
    return a;
  });
  *stats = Tensor::empty({s.rms ? 1 : 2, rows});
  float* st = stats->data<float>();
  Tensor y = Tensor::empty({rows, cols});
  float* yd = y.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const float m = static_cast<float>(mean[static_cast<size_t>(r)]);
    const float rstd = static_cast<float>(1.0 / std::sqrt(sq[static_cast<size_t>(r)] / H + s.eps));
    if (s.rms) {
      st[r] = rstd;
    } else {
      st[r] = m;
      st[rows + r] = rstd;
    }
    for (int64_t j = 0; j < cols; ++j) {
      const float xhat = (xd[r * cols + j] - m) * rstd;
      yd[r * cols + j] = xhat * gamma[j] + (beta ? beta[j] : 0.0f);
    }
  }
  return y;
}

Tensor norm_2d_backward(const Norm2dSpec& s, const Tensor& dy, const Tensor& x, const Tensor& stats,
                        const float* gamma, Communicator& g, float* dgamma, float* dbeta) {
  const int64_t rows = x.size(0), cols = x.size(1);
  GALE_CHECK(dy.dtype() == DType::kF32 && dy.size(0) == rows && dy.size(1) == cols) << "norm_2d_backward: shapes";
  const float* xd = x.data<float>();
  const float* dyd = dy.data<float>();
  const float* st = stats.data<float>();
  auto mean_of = [&](int64_t r) { return s.rms ? 0.0f : st[r]; };
  auto rstd_of = [&](int64_t r) { return s.rms ? st[r] : st[rows + r]; };
  auto xhat = [&](int64_t r, int64_t j) { return (xd[r * cols + j] - mean_of(r)) * rstd_of(r); };
  std::vector<double> sum_g(static_cast<size_t>(rows), 0.0);
  if (!s.rms)
    sum_g = row_sums(rows, g, [&](int64_t r) {
      double a = 0.0;
      for (int64_t j = 0; j < cols; ++j) a += static_cast<double>(dyd[r * cols + j]) * gamma[j];
      return a;
    });
  const std::vector<double> sum_gx = row_sums(rows, g, [&](int64_t r) {
    double a = 0.0;
    for (int64_t j = 0; j < cols; ++j) a += static_cast<double>(dyd[r * cols + j]) * gamma[j] * xhat(r, j);
    return a;
  });
  const double H = static_cast<double>(s.hidden);
  Tensor dx = Tensor::empty({rows, cols});
  float* dxd = dx.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const double mg = sum_g[static_cast<size_t>(r)] / H, mgx = sum_gx[static_cast<size_t>(r)] / H;
    for (int64_t j = 0; j < cols; ++j) {
      const double gj = static_cast<double>(dyd[r * cols + j]) * gamma[j];
      dxd[r * cols + j] = static_cast<float>(rstd_of(r) * (gj - mg - xhat(r, j) * mgx));
      if (dgamma) dgamma[j] += dyd[r * cols + j] * xhat(r, j);
      if (dbeta) dbeta[j] += dyd[r * cols + j];
    }
  }
  return dx;
}

}  // namespace gale
