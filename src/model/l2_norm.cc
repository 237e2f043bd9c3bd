// --qk-l2-norm's weightless L2 norm of rows (model/l2_norm.h).
#include "model/l2_norm.h"

#include <cmath>

namespace gale {

void l2_norm_forward(const float* x, float* y, float* inv, int64_t rows, int64_t dim, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    double sq = 0.0;
    for (int64_t j = 0; j < dim; ++j) sq += static_cast<double>(xr[j]) * xr[j];
    const float s = static_cast<float>(1.0 / std::sqrt(sq / static_cast<double>(dim) + eps));
    inv[r] = s;
    for (int64_t j = 0; j < dim; ++j) yr[j] = xr[j] * s;
  }
}

void l2_norm_backward(const float* dy, const float* x, const float* inv, float* dx, int64_t rows, int64_t dim) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* dyr = dy + r * dim;
    const float* xr = x + r * dim;
    float* dxr = dx + r * dim;
    double dot = 0.0;
    for (int64_t j = 0; j < dim; ++j) dot += static_cast<double>(dyr[j]) * xr[j];
    const float s = inv[r];
    const float c = static_cast<float>(dot / static_cast<double>(dim)) * s * s * s;
    for (int64_t j = 0; j < dim; ++j) dxr[j] = s * dyr[j] - xr[j] * c;
  }
}

}  // namespace gale
