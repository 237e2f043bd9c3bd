// numpy.sum, normalisation and Python rounding.
#include "data/numpy_math.h"

#include <cfenv>
#include <cmath>

namespace gale {

namespace {
double pairwise_sum(const double* a, int64_t n) {
  if (n < 8) {
    double res = 0.0;
    for (int64_t i = 0; i < n; ++i) res += a[i];
    return res;
  }
  if (n <= 128) {
    double r[8];
    for (int j = 0; j < 8; ++j) r[j] = a[j];
    int64_t i = 8;
    for (; i < n - (n % 8); i += 8)
      for (int j = 0; j < 8; ++j) r[j] += a[i + j];
    double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += a[i];
    return res;
  }
  int64_t n2 = n / 2;
  n2 -= n2 % 8;
  return pairwise_sum(a, n2) + pairwise_sum(a + n2, n - n2);
}
}  // namespace

double numpy_sum(std::span<const double> a) { return pairwise_sum(a.data(), static_cast<int64_t>(a.size())); }

std::vector<double> numpy_normalize(std::span<const double> w) {
  double s = numpy_sum(w);
  std::vector<double> out(w.size());
  for (size_t i = 0; i < w.size(); ++i) out[i] = w[i] / s;
  return out;
}

int64_t python_round(double x) {
  // nearbyint rounds with the current mode; the default (and the only one Gale uses) is
  // round-to-nearest-even, which is Python's rule.
  return static_cast<int64_t>(std::nearbyint(x));
}

}  // namespace gale
