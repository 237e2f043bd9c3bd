// GeLU, squared ReLU, SwiGLU and the general gated (GLU) activations and bias addition: plain reference kernels (level 0).
//
// Backward kernels WRITE the input gradient (dx =), never accumulate.
#pragma once

#include <cmath>
#include <cstdint>

namespace gale {

// y = 0.5·x·(1 + erf(x/√2)) (exact GeLU, torch's F.gelu default). y may alias x.
void gelu_forward_ref(const float* x, float* y, int64_t n);
// dx = dy · gelu'(x). dx may alias dy.
void gelu_backward_ref(const float* dy, const float* x, float* dx, int64_t n);

// y = 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) (Megatron's --openai-gelu, Hugging Face's
// gelu_new / gelu_pytorch_tanh). y may alias x.
void gelu_tanh_forward_ref(const float* x, float* y, int64_t n);
// dx = dy · d/dx of the above. dx may alias dy.
void gelu_tanh_backward_ref(const float* dy, const float* x, float* dx, int64_t n);

// y = max(x, 0)² (Megatron's --squared-relu, Primer / Nemotron's relu2). y may alias x.
void squared_relu_forward_ref(const float* x, float* y, int64_t n);
// dx = dy · 2·max(x, 0). dx may alias dy.
void squared_relu_backward_ref(const float* dy, const float* x, float* dx, int64_t n);

// x is [rows, 2F]: gate = x[:, :F], up = x[:, F:]; y[rows, F] = silu(gate) · up.
void swiglu_forward_ref(const float* x, float* y, int64_t rows, int64_t F);
// dx[rows, 2F] from dy[rows, F] and the forward input x.
void swiglu_backward_ref(const float* dy, const float* x, float* dx, int64_t rows, int64_t F);

// The gated linear unit of Megatron's glu() (transformer/mlp.py, moe/experts.py) with its gpt-oss
// options: for gate a = x[:, :F] and linear half b = x[:, F:],
//   a' = min(a, clamp),  b' = min(max(b, −clamp), clamp)      (no clamping when clamp is +inf)
//   y  = a'·σ(alpha·a') · (b' + linear_offset)
// alpha = 1 is SwiGLU's SiLU (--swiglu), alpha = 1.702 Megatron's quick_gelu (--quick-geglu);
// linear_offset is --glu-linear-offset and clamp --activation-func-clamp-value.
struct GluSpec {
  float alpha = 1.0f;
  float linear_offset = 0.0f;
  float clamp = HUGE_VALF;
};
inline constexpr float kQuickGeluAlpha = 1.702f;  // Megatron's quick_gelu: x·σ(1.702·x)

// x is [rows, 2F]; y[rows, F] as GluSpec says.
void glu_forward_ref(const GluSpec& spec, const float* x, float* y, int64_t rows, int64_t F);
// dx[rows, 2F] from dy[rows, F] and the forward input x (before clamping). A clamped entry has a
// zero gradient (a > clamp; b < −clamp or b > clamp; at the clamp value itself the gradient passes,
// as torch.clamp's).
void glu_backward_ref(const GluSpec& spec, const float* dy, const float* x, float* dx, int64_t rows, int64_t F);

// y[i] += x[i] for i < n (residual-gradient sums; parallel, vectorised by the compiler).
void add_inplace(float* y, const float* x, int64_t n);

// y[r, :] += bias[:] for a [rows, N] matrix.
void add_bias_ref(float* y, const float* bias, int64_t rows, int64_t N);

}  // namespace gale
