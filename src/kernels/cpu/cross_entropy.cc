// Reference cross-entropy kernels.
#include "kernels/cpu/cross_entropy.h"

#include <cmath>
#include <limits>

#include "core/threads.h"

namespace gale {

void ce_row_max(const float* logits, int64_t T, int64_t Vl, float* row_max) {
  parallel_for(T, 4, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* row = logits + t * Vl;
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t v = 0; v < Vl; ++v) m = std::max(m, row[v]);
      row_max[t] = m;
    }
  });
}

void ce_sumexp_and_target(const float* logits, int64_t T, int64_t Vl, const float* row_max, const int32_t* targets,
                          int64_t vocab_start, float* sumexp, float* target_logit) {
  parallel_for(T, 4, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* row = logits + t * Vl;
      double s = 0.0;
      for (int64_t v = 0; v < Vl; ++v) s += std::exp(row[v] - row_max[t]);
      sumexp[t] = static_cast<float>(s);
      int64_t local = static_cast<int64_t>(targets[t]) - vocab_start;
      target_logit[t] = (local >= 0 && local < Vl) ? row[local] : 0.0f;
    }
  });
}

void ce_backward_inplace(float* logits, int64_t T, int64_t Vl, const float* row_max, const float* sumexp,
                         const int32_t* targets, int64_t vocab_start, const float* dloss) {
  parallel_for(T, 4, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* row = logits + t * Vl;
      float inv = 1.0f / sumexp[t], d = dloss[t], m = row_max[t];
      for (int64_t v = 0; v < Vl; ++v) row[v] = std::exp(row[v] - m) * inv * d;
      int64_t local = static_cast<int64_t>(targets[t]) - vocab_start;
      if (local >= 0 && local < Vl) row[local] -= d;
    }
  });
}

}  // namespace gale
