// The MLP activation the model's flags select: SwiGLU (--swiglu), squared ReLU (--squared-relu), tanh GeLU
// (--openai-gelu) or exact GeLU.
#pragma once

#include "kernels/op_table.h"
#include "model/config.h"

namespace gale {

inline ActivationForwardFn mlp_activation_forward(const ModelConfig& c, const OpTable& ops) {
  if (c.swiglu) return ops.swiglu_forward;
  if (c.squared_relu) return ops.squared_relu_forward;
  return c.openai_gelu ? ops.gelu_tanh_forward : ops.gelu_forward;
}

inline ActivationBackwardFn mlp_activation_backward(const ModelConfig& c, const OpTable& ops) {
  if (c.swiglu) return ops.swiglu_backward;
  if (c.squared_relu) return ops.squared_relu_backward;
  return c.openai_gelu ? ops.gelu_tanh_backward : ops.gelu_backward;
}

}  // namespace gale
