// Reference GeGLU kernels (erf or tanh GeLU gate).
#include "kernels/cpu/geglu.h"

#include <cmath>

#include "core/threads.h"

namespace gale {

namespace {

constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;
constexpr float kSqrt2OverPi = 0.79788456080286536f;
constexpr float kTanhCubic = 0.044715f;

// gelu(a) and, when d is given, gelu'(a).
inline float gelu_of(GegluGate gate, float a, float* d) {
  if (gate == GegluGate::kErf) {
    const float cdf = 0.5f * (1.0f + std::erf(a * kInvSqrt2));
    if (d) *d = cdf + a * kInvSqrt2Pi * std::exp(-0.5f * a * a);
    return a * cdf;
  }
  const float t = std::tanh(kSqrt2OverPi * (a + kTanhCubic * a * a * a));
  if (d) *d = 0.5f * (1.0f + t) + 0.5f * a * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * kTanhCubic * a * a);
  return 0.5f * a * (1.0f + t);
}

}  // namespace

void geglu_forward_ref(GegluGate gate, float* u, const float* bias, float* act, int64_t rows, int64_t F) {
  parallel_for(rows, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* a = u + r * 2 * F;
      float* b = a + F;
      float* y = act + r * F;
      for (int64_t i = 0; i < F; ++i) {
        if (bias) {
          a[i] += bias[i];
          b[i] += bias[F + i];
        }
        y[i] = gelu_of(gate, a[i], nullptr) * b[i];
      }
    }
  });
}

void geglu_backward_ref(GegluGate gate, const float* dact, const float* u, float* du, float* dbias, int64_t rows,
                        int64_t F) {
  parallel_for(rows, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* a = u + r * 2 * F;
      const float* b = a + F;
      const float* d = dact + r * F;
      float* da = du + r * 2 * F;
      float* db = da + F;
      for (int64_t i = 0; i < F; ++i) {
        float g1 = 0.0f;
        const float g = gelu_of(gate, a[i], &g1);
        da[i] = d[i] * b[i] * g1;
        db[i] = d[i] * g;
      }
    }
  });
  if (!dbias) return;
  for (int64_t r = 0; r < rows; ++r)  // rows in order: the same sums whatever the thread count
    for (int64_t j = 0; j < 2 * F; ++j) dbias[j] += du[r * 2 * F + j];
}

}  // namespace gale
