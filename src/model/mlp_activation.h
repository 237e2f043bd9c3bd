// The MLP activation the model's flags select: SwiGLU (--swiglu), quick-GEGLU (--quick-geglu), either
// with --glu-linear-offset / --activation-func-clamp-value, squared ReLU (--squared-relu), tanh GeLU
// (--openai-gelu) or exact GeLU, or GeGLU (MindSpeed-LLM's --geglu / --gelu-tanh).
#pragma once

#include <cmath>

#include "kernels/cpu/fused_geglu.h"
#include "kernels/op_table.h"
#include "model/config.h"

namespace gale {

// The gated activation's options (alpha, offset, clamp; +inf when there is no clamp).
inline GluSpec mlp_glu_spec(const ModelConfig& c) {
  GluSpec s;
  s.alpha = c.quick_geglu ? kQuickGeluAlpha : 1.0f;
  s.linear_offset = c.glu_linear_offset;
  s.clamp = c.activation_clamp > 0.0f ? c.activation_clamp : HUGE_VALF;
  return s;
}

// Whether the model's MLP runs the GluSpec kernels (op table glu_forward/glu_backward).
inline bool mlp_uses_glu_kernels(const ModelConfig& c) {
  return c.quick_geglu || (c.swiglu && (c.glu_linear_offset != 0.0f || c.activation_clamp > 0.0f));
}

// GeGLU's gate (ModelConfig::geglu; the tanh GeLU with openai_gelu).
inline GegluGate mlp_geglu_gate(const ModelConfig& c) { return c.openai_gelu ? GegluGate::kTanh : GegluGate::kErf; }

// One call of the model's activation forward: fn(u, bias, act, rows, F) as ActivationForwardFn.
// GeGLU has no op-table function entry: it runs the kernels ops.impl["geglu"] names
// (kernels/cpu/fused_geglu.h): the reference, or the fused build that --use-fused-swiglu installs.
struct MlpActivationForward {
  ActivationForwardFn plain = nullptr;
  GluForwardFn glu = nullptr;
  GluSpec spec;
  bool geglu = false;
  GegluGate gate = GegluGate::kErf;
  GegluForwardFn geglu_fn = geglu_forward_ref;
  void operator()(float* u, const float* bias, float* act, int64_t rows, int64_t F) const {
    if (geglu) {
      geglu_fn(gate, u, bias, act, rows, F);
    } else if (glu) {
      glu(spec, u, bias, act, rows, F);
    } else {
      plain(u, bias, act, rows, F);
    }
  }
};

struct MlpActivationBackward {
  ActivationBackwardFn plain = nullptr;
  GluBackwardFn glu = nullptr;
  GluSpec spec;
  bool geglu = false;
  GegluGate gate = GegluGate::kErf;
  GegluBackwardFn geglu_fn = geglu_backward_ref;
  void operator()(const float* dact, const float* u, float* du, float* dbias, int64_t rows, int64_t F) const {
    if (geglu) {
      geglu_fn(gate, dact, u, du, dbias, rows, F);
    } else if (glu) {
      glu(spec, dact, u, du, dbias, rows, F);
    } else {
      plain(dact, u, du, dbias, rows, F);
    }
  }
};

inline MlpActivationForward mlp_activation_forward(const ModelConfig& c, const OpTable& ops) {
  MlpActivationForward f;
  if (c.geglu) {
    f.geglu = true;
    f.gate = mlp_geglu_gate(c);
    f.geglu_fn = geglu_kernels(ops).forward;
  } else if (mlp_uses_glu_kernels(c)) {
    f.glu = ops.glu_forward;
    f.spec = mlp_glu_spec(c);
  } else if (c.swiglu) {
    f.plain = ops.swiglu_forward;
  } else if (c.squared_relu) {
    f.plain = ops.squared_relu_forward;
  } else {
    f.plain = c.openai_gelu ? ops.gelu_tanh_forward : ops.gelu_forward;
  }
  return f;
}

inline MlpActivationBackward mlp_activation_backward(const ModelConfig& c, const OpTable& ops) {
  MlpActivationBackward b;
  if (c.geglu) {
    b.geglu = true;
    b.gate = mlp_geglu_gate(c);
    b.geglu_fn = geglu_kernels(ops).backward;
  } else if (mlp_uses_glu_kernels(c)) {
    b.glu = ops.glu_backward;
    b.spec = mlp_glu_spec(c);
  } else if (c.swiglu) {
    b.plain = ops.swiglu_backward;
  } else if (c.squared_relu) {
    b.plain = ops.squared_relu_backward;
  } else {
    b.plain = c.openai_gelu ? ops.gelu_tanh_backward : ops.gelu_backward;
  }
  return b;
}

}  // namespace gale
