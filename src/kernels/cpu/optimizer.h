// Optimizer update and gradient-norm kernels over flat float buffers: reference versions.
#pragma once

#include <cstdint>

namespace gale {

struct AdamWHyper {
  float lr = 0.0f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
  int64_t step = 1;  // 1-based, for bias correction
  // The gradient used is g·grad_scale (a float product, exactly what scale_inplace(g, n, s) then
  // the step would use): gradient clipping folded into the step, saving a pass over the gradients.
  float grad_scale = 1.0f;
};

// AdamW as Megatron's fused Adam in AdamW mode (docs/model.md), with g = grad·grad_scale:
//   m = β1·m + (1−β1)·g;  v = β2·v + (1−β2)·g²
//   p = p − lr·( (m/(1−β1ᵗ)) / (sqrt(v/(1−β2ᵗ)) + eps) + wd·p )
void adamw_step_ref(float* p, const float* g, float* m, float* v, int64_t n, const AdamWHyper& h);

// MindSpeed's fused EMA AdamW (--optimizer-selection fused_ema_adamw, npu_apply_fused_ema_adamw in
// AdamW mode): the AdamW step above, then the exponential moving average `s` of the parameters
// takes the *updated* values:
//   s = d·s + (1 − d)·p_new      (d = ema_decay; float arithmetic, no fused multiply-add)
// The parameters and moments are exactly adamw_step_ref's. The reference is the two passes.
void ema_adamw_step_ref(float* p, const float* g, float* m, float* v, float* s, int64_t n, const AdamWHyper& h,
                        float ema_decay);
// The EMA pass alone: s = d·s + (1 − d)·p.
void ema_update_ref(float* s, const float* p, int64_t n, float ema_decay);

// torch.optim.SGD with momentum and L2 weight decay: g' = g + wd·p; buf = first ? g' : μ·buf + g';
// p = p − lr·buf.
void sgd_step_ref(float* p, const float* g, float* buf, int64_t n, float lr, float momentum, float weight_decay,
                  bool first_step);

// Lion (emerging_optimizers' Lion, decoupled weight decay; optim/optimizer.h LionConfig):
//   p = p − lr·wd·p;  c = lerp(m, g, 1−β1);  m = lerp(m, g, 1−β2);  p = p − lr·sign(c)
// in f32 as torch computes it: the scalars −lr·wd, 1−β1, 1−β2 and −lr formed in double and rounded
// once, the two `add_(x, alpha)` as fused multiply-adds, lerp as ATen's CPU lerp; sign(0) = 0.
void lion_step_ref(float* p, const float* g, float* m, int64_t n, double lr, double beta1, double beta2,
                   double weight_decay);

// Σ x², accumulated in double over fixed chunks (deterministic for any thread count).
double sum_of_squares(const float* x, int64_t n);
// Number of exact zeros.
int64_t count_zeros(const float* x, int64_t n);
// x *= s
void scale_inplace(float* x, int64_t n, float s);
// True when every element is finite.
bool all_finite(const float* x, int64_t n);

}  // namespace gale
