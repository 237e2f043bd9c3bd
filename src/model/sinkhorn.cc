// Sinkhorn-Knopp forward and backward through its iterations, in double (model/sinkhorn.h).
#include "model/sinkhorn.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace gale {

namespace {

// One normalisation step over rows (by_rows) or columns of m [n, n], in place; *sums gets the
// unclamped sums (what backward needs).
void normalise(std::vector<double>& m, int64_t n, bool by_rows, std::vector<double>* sums) {
  sums->assign(static_cast<size_t>(n), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) (*sums)[static_cast<size_t>(by_rows ? i : j)] += m[static_cast<size_t>(i * n + j)];
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j)
      m[static_cast<size_t>(i * n + j)] /= std::max((*sums)[static_cast<size_t>(by_rows ? i : j)], kSinkhornEps);
}

}  // namespace

void sinkhorn_forward(const float* logits, float* m0, float* out, int64_t n, int64_t iterations) {
  std::vector<double> m(static_cast<size_t>(n * n)), sums;
  for (int64_t i = 0; i < n; ++i) {
    double mx = logits[i * n];
    for (int64_t j = 1; j < n; ++j) mx = std::max(mx, static_cast<double>(logits[i * n + j]));
    for (int64_t j = 0; j < n; ++j) {
      const float e = static_cast<float>(std::exp(static_cast<double>(logits[i * n + j]) - mx));
      m0[i * n + j] = e;
      m[static_cast<size_t>(i * n + j)] = e;
    }
  }
  for (int64_t k = 0; k < iterations; ++k) {
    normalise(m, n, true, &sums);
    normalise(m, n, false, &sums);
  }
  for (int64_t i = 0; i < n * n; ++i) out[i] = static_cast<float>(m[static_cast<size_t>(i)]);
}

void sinkhorn_backward(const float* m0, const float* d_out, float* d_logits, int64_t n, int64_t iterations) {
  // Rerun forward keeping each step's input and sums: step 2k normalises rows, 2k + 1 columns.
  const size_t nn = static_cast<size_t>(n * n);
  const int64_t steps = 2 * iterations;
  std::vector<std::vector<double>> inputs(static_cast<size_t>(steps)), sums(static_cast<size_t>(steps));
  std::vector<double> m(nn);
  for (size_t i = 0; i < nn; ++i) m[i] = m0[i];
  for (int64_t s = 0; s < steps; ++s) {
    inputs[static_cast<size_t>(s)] = m;
    normalise(m, n, s % 2 == 0, &sums[static_cast<size_t>(s)]);
  }
  // Back through each step: B = A / c (c = max(sum, ε) of A's row or column): dA = dB / c − [sum ≥ ε]·(Σ dB⊙A) / c².
  std::vector<double> d(nn), dot(static_cast<size_t>(n));
  for (size_t i = 0; i < nn; ++i) d[i] = d_out[i];
  for (int64_t s = steps; s-- > 0;) {
    const std::vector<double>& a = inputs[static_cast<size_t>(s)];
    const std::vector<double>& sum = sums[static_cast<size_t>(s)];
    const bool by_rows = s % 2 == 0;
    std::fill(dot.begin(), dot.end(), 0.0);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j)
        dot[static_cast<size_t>(by_rows ? i : j)] += d[static_cast<size_t>(i * n + j)] * a[static_cast<size_t>(i * n + j)];
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j) {
        const size_t g = static_cast<size_t>(by_rows ? i : j);
        const double c = std::max(sum[g], kSinkhornEps);
        double v = d[static_cast<size_t>(i * n + j)] / c;
        if (sum[g] >= kSinkhornEps) v -= dot[g] / (c * c);
        d[static_cast<size_t>(i * n + j)] = v;
      }
  }
  for (size_t i = 0; i < nn; ++i) d_logits[i] = static_cast<float>(d[i] * static_cast<double>(m0[i]));
}

}  // namespace gale
