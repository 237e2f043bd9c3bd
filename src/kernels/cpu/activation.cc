// Reference GeLU / squared-ReLU / SwiGLU / gated-GLU / bias kernels.
#include "kernels/cpu/activation.h"

#include <algorithm>
#include <cmath>

#include "core/threads.h"

namespace gale {

namespace {
constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;
constexpr float kSqrt2OverPi = 0.79788456080286536f;
inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
constexpr int64_t kGrain = 1 << 14;
}  // namespace

void gelu_forward_ref(const float* x, float* y, int64_t n) {
  parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) y[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * kInvSqrt2));
  });
}

void gelu_backward_ref(const float* dy, const float* x, float* dx, int64_t n) {
  parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      float v = x[i];
      float cdf = 0.5f * (1.0f + std::erf(v * kInvSqrt2));
      float pdf = kInvSqrt2Pi * std::exp(-0.5f * v * v);
      dx[i] = dy[i] * (cdf + v * pdf);
    }
  });
}

void gelu_tanh_forward_ref(const float* x, float* y, int64_t n) {
  parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float v = x[i];
      y[i] = 0.5f * v * (1.0f + std::tanh(kSqrt2OverPi * (v + 0.044715f * v * v * v)));
    }
  });
}

void gelu_tanh_backward_ref(const float* dy, const float* x, float* dx, int64_t n) {
  parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float v = x[i];
      const float t = std::tanh(kSqrt2OverPi * (v + 0.044715f * v * v * v));
      const float dt = (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * 0.044715f * v * v);
      dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * dt);
    }
  });
}

void squared_relu_forward_ref(const float* x, float* y, int64_t n) {
  parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float r = x[i] > 0.0f ? x[i] : 0.0f;
      y[i] = r * r;
    }
  });
}

void squared_relu_backward_ref(const float* dy, const float* x, float* dx, int64_t n) {
  parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) dx[i] = x[i] > 0.0f ? dy[i] * 2.0f * x[i] : 0.0f;
  });
}

void swiglu_forward_ref(const float* x, float* y, int64_t rows, int64_t F) {
  parallel_for(rows, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* gate = x + r * 2 * F;
      const float* up = gate + F;
      float* yr = y + r * F;
      for (int64_t i = 0; i < F; ++i) yr[i] = gate[i] * sigmoid(gate[i]) * up[i];
    }
  });
}

void swiglu_backward_ref(const float* dy, const float* x, float* dx, int64_t rows, int64_t F) {
  parallel_for(rows, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* gate = x + r * 2 * F;
      const float* up = gate + F;
      const float* dyr = dy + r * F;
      float* dgate = dx + r * 2 * F;
      float* dup = dgate + F;
      for (int64_t i = 0; i < F; ++i) {
        float s = sigmoid(gate[i]);
        float silu = gate[i] * s;
        dup[i] = dyr[i] * silu;
        dgate[i] = dyr[i] * up[i] * s * (1.0f + gate[i] * (1.0f - s));
      }
    }
  });
}

void glu_forward_ref(const GluSpec& spec, const float* x, float* y, int64_t rows, int64_t F) {
  parallel_for(rows, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* gate = x + r * 2 * F;
      const float* lin = gate + F;
      float* yr = y + r * F;
      for (int64_t i = 0; i < F; ++i) {
        const float a = std::min(gate[i], spec.clamp);
        const float b = std::min(std::max(lin[i], -spec.clamp), spec.clamp);
        yr[i] = a * sigmoid(spec.alpha * a) * (b + spec.linear_offset);
      }
    }
  });
}

void glu_backward_ref(const GluSpec& spec, const float* dy, const float* x, float* dx, int64_t rows, int64_t F) {
  parallel_for(rows, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* gate = x + r * 2 * F;
      const float* lin = gate + F;
      const float* dyr = dy + r * F;
      float* dgate = dx + r * 2 * F;
      float* dlin = dgate + F;
      for (int64_t i = 0; i < F; ++i) {
        const float a = std::min(gate[i], spec.clamp);
        const float b = std::min(std::max(lin[i], -spec.clamp), spec.clamp);
        const float s = sigmoid(spec.alpha * a);
        // d/da of a·σ(αa) = σ(αa)·(1 + αa·(1 − σ(αa)))
        dgate[i] = gate[i] <= spec.clamp ? dyr[i] * (b + spec.linear_offset) * s * (1.0f + spec.alpha * a * (1.0f - s))
                                         : 0.0f;
        dlin[i] = lin[i] >= -spec.clamp && lin[i] <= spec.clamp ? dyr[i] * a * s : 0.0f;
      }
    }
  });
}

void add_inplace(float* y, const float* x, int64_t n) {
  parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) y[i] += x[i];
  });
}

void add_bias_ref(float* y, const float* bias, int64_t rows, int64_t N) {
  parallel_for(rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* yr = y + r * N;
      for (int64_t i = 0; i < N; ++i) yr[i] += bias[i];
    }
  });
}

}  // namespace gale
