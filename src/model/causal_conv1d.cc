// Causal depthwise conv1d over strided rows: the reference loops, parallel over rows (forward) and channels (backward).
#include "model/causal_conv1d.h"

#include "core/threads.h"

namespace gale {

void causal_conv1d_forward(const float* x, int64_t x_stride, const float* w, const float* bias, float* y, int64_t C,
                           int64_t K, int64_t S, int64_t B) {
  parallel_for(S * B, 64, [&](int64_t b0, int64_t e0) {
    for (int64_t t = b0; t < e0; ++t) {
      const int64_t s = t / B, b = t % B;
      float* out = y + t * C;
      for (int64_t c = 0; c < C; ++c) out[c] = bias ? bias[c] : 0.0f;
      for (int64_t k = 0; k < K; ++k) {
        const int64_t s2 = s - K + 1 + k;
        if (s2 < 0) continue;
        const float* in = x + (s2 * B + b) * x_stride;
        for (int64_t c = 0; c < C; ++c) out[c] += w[c * K + k] * in[c];
      }
    }
  });
}

void causal_conv1d_backward(const float* dy, const float* x, int64_t x_stride, const float* w, float* dx,
                            int64_t dx_stride, float* dw, float* db, int64_t C, int64_t K, int64_t S, int64_t B) {
  parallel_for(C, 16, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t b = 0; b < B; ++b)
        for (int64_t s = 0; s < S; ++s) {
          const float g = dy[(s * B + b) * C + c];
          if (db) db[c] += g;
          for (int64_t k = 0; k < K; ++k) {
            const int64_t s2 = s - K + 1 + k;
            if (s2 < 0) continue;
            const int64_t t2 = s2 * B + b;
            if (dw) dw[c * K + k] += g * x[t2 * x_stride + c];
            dx[t2 * dx_stride + c] += w[c * K + k] * g;
          }
        }
  });
}

}  // namespace gale
