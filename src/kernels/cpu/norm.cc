// Reference LayerNorm / RMSNorm kernels and deterministic column reductions.
#include "kernels/cpu/norm.h"

#include <cmath>
#include <vector>

#include "core/threads.h"

namespace gale {

namespace {
// Fixed number of row chunks for column reductions: independent of the thread count.
constexpr int64_t kReduceChunks = 32;

template <class RowFn>
void reduce_columns(int64_t rows, int64_t H, float* out, RowFn&& row_contrib) {
  int64_t chunks = std::min<int64_t>(kReduceChunks, rows);
  if (chunks <= 0) return;
  std::vector<float> partial(static_cast<size_t>(chunks * H), 0.0f);
  parallel_for(chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      float* acc = partial.data() + c * H;
      for (int64_t r = rows * c / chunks; r < rows * (c + 1) / chunks; ++r) row_contrib(r, acc);
    }
  });
  for (int64_t c = 0; c < chunks; ++c) {
    const float* p = partial.data() + c * H;
    for (int64_t i = 0; i < H; ++i) out[i] += p[i];
  }
}
}  // namespace

void column_sum_accumulate(const float* x, float* out, int64_t rows, int64_t H) {
  reduce_columns(rows, H, out, [&](int64_t r, float* acc) {
    const float* xr = x + r * H;
    for (int64_t i = 0; i < H; ++i) acc[i] += xr[i];
  });
}

void column_dot_accumulate(const float* a, const float* b, float* out, int64_t rows, int64_t H) {
  reduce_columns(rows, H, out, [&](int64_t r, float* acc) {
    const float* ar = a + r * H;
    const float* br = b + r * H;
    for (int64_t i = 0; i < H; ++i) acc[i] += ar[i] * br[i];
  });
}

void layernorm_forward_ref(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd,
                           int64_t rows, int64_t H, float eps) {
  parallel_for(rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * H;
      double sum = 0.0;
      for (int64_t i = 0; i < H; ++i) sum += xr[i];
      double mu = sum / H;
      double var = 0.0;
      for (int64_t i = 0; i < H; ++i) var += (xr[i] - mu) * (xr[i] - mu);
      var /= H;
      float rs = static_cast<float>(1.0 / std::sqrt(var + eps));
      float m = static_cast<float>(mu);
      float* yr = y + r * H;
      for (int64_t i = 0; i < H; ++i) yr[i] = (xr[i] - m) * rs * w[i] + (b ? b[i] : 0.0f);
      mean[r] = m;
      rstd[r] = rs;
    }
  });
}

void layernorm_backward_ref(const float* dy, const float* x, const float* w, const float* mean, const float* rstd,
                            float* dx, float* dw, float* db, int64_t rows, int64_t H) {
  parallel_for(rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * H;
      const float* dyr = dy + r * H;
      float m = mean[r], rs = rstd[r];
      double sum_g = 0.0, sum_gx = 0.0;  // Σ dy·w, Σ dy·w·xhat
      for (int64_t i = 0; i < H; ++i) {
        float g = dyr[i] * w[i];
        sum_g += g;
        sum_gx += g * (xr[i] - m) * rs;
      }
      float mean_g = static_cast<float>(sum_g / H), mean_gx = static_cast<float>(sum_gx / H);
      float* dxr = dx + r * H;
      for (int64_t i = 0; i < H; ++i) {
        float xhat = (xr[i] - m) * rs;
        dxr[i] = rs * (dyr[i] * w[i] - mean_g - xhat * mean_gx);
      }
    }
  });
  if (dw) {
    reduce_columns(rows, H, dw, [&](int64_t r, float* acc) {
      const float* xr = x + r * H;
      const float* dyr = dy + r * H;
      float m = mean[r], rs = rstd[r];
      for (int64_t i = 0; i < H; ++i) acc[i] += dyr[i] * (xr[i] - m) * rs;
    });
  }
  if (db) column_sum_accumulate(dy, db, rows, H);
}

void rmsnorm_forward_ref(const float* x, const float* w, float* y, float* rstd, int64_t rows, int64_t H, float eps) {
  parallel_for(rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * H;
      double ss = 0.0;
      for (int64_t i = 0; i < H; ++i) ss += static_cast<double>(xr[i]) * xr[i];
      float rs = static_cast<float>(1.0 / std::sqrt(ss / H + eps));
      float* yr = y + r * H;
      for (int64_t i = 0; i < H; ++i) yr[i] = xr[i] * rs * w[i];
      rstd[r] = rs;
    }
  });
}

void rmsnorm_backward_ref(const float* dy, const float* x, const float* w, const float* rstd, float* dx, float* dw,
                          int64_t rows, int64_t H) {
  parallel_for(rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * H;
      const float* dyr = dy + r * H;
      float rs = rstd[r];
      double sum_gx = 0.0;  // Σ dy·w·xhat
      for (int64_t i = 0; i < H; ++i) sum_gx += dyr[i] * w[i] * xr[i] * rs;
      float mean_gx = static_cast<float>(sum_gx / H);
      float* dxr = dx + r * H;
      for (int64_t i = 0; i < H; ++i) dxr[i] = rs * (dyr[i] * w[i] - xr[i] * rs * mean_gx);
    }
  });
  if (dw) {
    reduce_columns(rows, H, dw, [&](int64_t r, float* acc) {
      const float* xr = x + r * H;
      const float* dyr = dy + r * H;
      float rs = rstd[r];
      for (int64_t i = 0; i < H; ++i) acc[i] += dyr[i] * xr[i] * rs;
    });
  }
}

}  // namespace gale
