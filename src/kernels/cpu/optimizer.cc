// Reference optimizer kernels and reductions.
#include "kernels/cpu/optimizer.h"

#include <cmath>
#include <vector>

#include "core/threads.h"

namespace gale {

namespace {
constexpr int64_t kGrain = 1 << 15;
constexpr int64_t kChunk = 1 << 16;  // fixed reduction chunk (elements)

template <class T, class Fn>
T chunked_reduce(int64_t n, Fn&& chunk_value) {
  int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<T> partial(static_cast<size_t>(chunks), T{});
  parallel_for(chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) partial[c] = chunk_value(c * kChunk, std::min(n, (c + 1) * kChunk));
  });
  T total{};
  for (T v : partial) total += v;
  return total;
}
}  // namespace

void adamw_step_ref(float* p, const float* g, float* m, float* v, int64_t n, const AdamWHyper& h) {
  const float bc1 = 1.0f - std::pow(h.beta1, static_cast<float>(h.step));
  const float bc2 = 1.0f - std::pow(h.beta2, static_cast<float>(h.step));
  parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float gi = g[i] * h.grad_scale;  // exact when grad_scale is 1
      m[i] = h.beta1 * m[i] + (1.0f - h.beta1) * gi;
      v[i] = h.beta2 * v[i] + (1.0f - h.beta2) * gi * gi;
      float update = (m[i] / bc1) / (std::sqrt(v[i] / bc2) + h.eps) + h.weight_decay * p[i];
      p[i] -= h.lr * update;
    }
  });
}

void ema_update_ref(float* s, const float* p, int64_t n, float ema_decay) {
  const float keep = ema_decay, take = 1.0f - ema_decay;
  parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) s[i] = keep * s[i] + take * p[i];
  });
}

void ema_adamw_step_ref(float* p, const float* g, float* m, float* v, float* s, int64_t n, const AdamWHyper& h,
                        float ema_decay) {
  adamw_step_ref(p, g, m, v, n, h);
  ema_update_ref(s, p, n, ema_decay);
}

void sgd_step_ref(float* p, const float* g, float* buf, int64_t n, float lr, float momentum, float weight_decay,
                  bool first_step) {
  parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      float d = g[i] + weight_decay * p[i];
      if (momentum != 0.0f) {
        buf[i] = first_step ? d : momentum * buf[i] + d;
        d = buf[i];
      }
      p[i] -= lr * d;
    }
  });
}

namespace {
// torch.lerp(start, end, weight) for a scalar weight, as ATen's CPU kernel computes it.
inline float aten_lerp(float start, float end, float weight) {
  return std::abs(weight) < 0.5f ? std::fma(weight, end - start, start) : std::fma(-(1.0f - weight), end - start, end);
}
}  // namespace

void lion_step_ref(float* p, const float* g, float* m, int64_t n, double lr, double beta1, double beta2,
                   double weight_decay) {
  const float decay = static_cast<float>(-weight_decay * lr), step = static_cast<float>(-lr);
  const float w1 = static_cast<float>(1.0 - beta1), w2 = static_cast<float>(1.0 - beta2);
  parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      float pi = weight_decay != 0.0 ? std::fma(p[i], decay, p[i]) : p[i];
      const float c = aten_lerp(m[i], g[i], w1);
      m[i] = aten_lerp(m[i], g[i], w2);
      const float sign = c > 0.0f ? 1.0f : c < 0.0f ? -1.0f : 0.0f;
      p[i] = std::fma(sign, step, pi);
    }
  });
}

double sum_of_squares(const float* x, int64_t n) {
  return chunked_reduce<double>(n, [&](int64_t b, int64_t e) {
    double s = 0.0;
    for (int64_t i = b; i < e; ++i) s += static_cast<double>(x[i]) * x[i];
    return s;
  });
}

int64_t count_zeros(const float* x, int64_t n) {
  return chunked_reduce<int64_t>(n, [&](int64_t b, int64_t e) {
    int64_t z = 0;
    for (int64_t i = b; i < e; ++i) z += (x[i] == 0.0f);
    return z;
  });
}

void scale_inplace(float* x, int64_t n, float s) {
  parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) x[i] *= s;
  });
}

bool all_finite(const float* x, int64_t n) {
  return chunked_reduce<int64_t>(n, [&](int64_t b, int64_t e) {
           int64_t bad = 0;
           for (int64_t i = b; i < e; ++i) bad += !std::isfinite(x[i]);
           return bad;
         }) == 0;
}

}  // namespace gale
