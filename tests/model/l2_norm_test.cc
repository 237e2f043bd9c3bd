// model/l2_norm.h: the forward's rows have mean square 1 (up to eps), scale invariance, and the
// backward against central finite differences (and in place).
#include "model/l2_norm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "testing.h"

namespace gale {
namespace {

using testing::random_vector;

TEST(L2Norm, RowsHaveMeanSquareOneAndKeepTheirDirection) {
  const int64_t rows = 3, dim = 7;
  std::vector<float> x = random_vector(rows * dim, 1, 2.5f), y(rows * dim), inv(rows);
  l2_norm_forward(x.data(), y.data(), inv.data(), rows, dim, 1e-6f);
  for (int64_t r = 0; r < rows; ++r) {
    double sq = 0.0, xsq = 0.0;
    for (int64_t j = 0; j < dim; ++j) {
      sq += double(y[r * dim + j]) * y[r * dim + j];
      xsq += double(x[r * dim + j]) * x[r * dim + j];
    }
    EXPECT_NEAR(sq / dim, 1.0, 1e-5) << r;
    EXPECT_NEAR(inv[r], 1.0 / std::sqrt(xsq / dim + 1e-6), 1e-6 * inv[r]) << r;
    for (int64_t j = 0; j < dim; ++j) EXPECT_NEAR(y[r * dim + j], x[r * dim + j] * inv[r], 1e-6) << r << "," << j;
  }
  // Scaling a row changes nothing; eps is added to the mean square (not its square root).
  std::vector<float> x3(x), y3(rows * dim), inv3(rows);
  for (float& v : x3) v *= 3.0f;
  l2_norm_forward(x3.data(), y3.data(), inv3.data(), rows, dim, 0.0f);
  for (int64_t i = 0; i < rows * dim; ++i) EXPECT_NEAR(y3[i], y[i], 1e-5) << i;
  const float zero[4] = {0, 0, 0, 0};
  float out[4], s;
  l2_norm_forward(zero, out, &s, 1, 4, 0.25f);
  EXPECT_FLOAT_EQ(s, 2.0f);  // 1 / sqrt(0 + 0.25)
}

TEST(L2Norm, BackwardMatchesFiniteDifferences) {
  const int64_t rows = 4, dim = 6;
  const float eps = 1e-2f;  // large enough to matter in the derivative
  std::vector<float> x = random_vector(rows * dim, 2, 0.3f), w = random_vector(rows * dim, 3);
  auto loss = [&](const std::vector<float>& in) {  // sum of w · y
    std::vector<float> y(rows * dim), inv(rows);
    l2_norm_forward(in.data(), y.data(), inv.data(), rows, dim, eps);
    double l = 0.0;
    for (int64_t i = 0; i < rows * dim; ++i) l += double(w[i]) * y[i];
    return l;
  };
  std::vector<float> y(rows * dim), inv(rows), dx(rows * dim);
  l2_norm_forward(x.data(), y.data(), inv.data(), rows, dim, eps);
  l2_norm_backward(w.data(), x.data(), inv.data(), dx.data(), rows, dim);
  const float h = 1e-3f;
  for (int64_t i = 0; i < rows * dim; ++i) {
    std::vector<float> p(x), m(x);
    p[i] += h;
    m[i] -= h;
    const double numeric = (loss(p) - loss(m)) / (2.0 * h);
    EXPECT_NEAR(dx[i], numeric, 2e-3 * std::max(1.0, std::abs(numeric))) << i;
  }
  // In place (dx aliasing dy) gives the same gradient.
  std::vector<float> g(w);
  l2_norm_backward(g.data(), x.data(), inv.data(), g.data(), rows, dim);
  for (int64_t i = 0; i < rows * dim; ++i) EXPECT_FLOAT_EQ(g[i], dx[i]) << i;
}

}  // namespace
}  // namespace gale
