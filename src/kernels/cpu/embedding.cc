// Reference embedding kernels.
#include "kernels/cpu/embedding.h"

#include <cstring>

#include "core/threads.h"

namespace gale {

void embedding_forward_ref(const int32_t* ids, int64_t T, const float* W, int64_t vocab_start, int64_t Vl, int64_t H,
                           float* out) {
  parallel_for(T, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      int64_t local = static_cast<int64_t>(ids[t]) - vocab_start;
      if (local >= 0 && local < Vl)
        std::memcpy(out + t * H, W + local * H, sizeof(float) * static_cast<size_t>(H));
      else
        std::memset(out + t * H, 0, sizeof(float) * static_cast<size_t>(H));
    }
  });
}

void embedding_backward_ref(const int32_t* ids, int64_t T, const float* dout, int64_t vocab_start, int64_t Vl,
                            int64_t H, float* dW) {
  parallel_for(H, 64, [&](int64_t c0, int64_t c1) {
    for (int64_t t = 0; t < T; ++t) {
      int64_t local = static_cast<int64_t>(ids[t]) - vocab_start;
      if (local < 0 || local >= Vl) continue;
      float* dst = dW + local * H;
      const float* src = dout + t * H;
      for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
    }
  });
}

}  // namespace gale
