// Megatron main's gated-MLP options (--quick-geglu, --glu-linear-offset, --activation-func-clamp-value): their checks.
#include "train/arguments.h"

#include <cmath>

namespace gale {

// Megatron's rules (training/argument_utils.py, TransformerConfig.__post_init__) where they are
// errors there, and Gale's own where Megatron silently ignores a value (an offset or clamp without a
// gated MLP, a clamp that is not a positive number).
Status validate_glu_args(const ModelArgs& m) {
  if (m.quick_geglu && m.swiglu)
    return InvalidArgument("--quick-geglu with --swiglu: the gated MLP has one activation (quick GeLU or SiLU)");
  if (m.quick_geglu && m.squared_relu)
    return InvalidArgument("--quick-geglu with --squared-relu: the MLP has one activation (quick GeGLU or squared ReLU)");
  if (m.quick_geglu && m.openai_gelu)
    return InvalidArgument("--quick-geglu with --openai-gelu: the quick GeGLU MLP has no tanh GeLU");
  if (!std::isfinite(m.glu_linear_offset))
    return InvalidArgument("--glu-linear-offset: expected a finite number, found ", m.glu_linear_offset);
  const bool clamp = !unset(m.activation_func_clamp_value);
  if (!m.gated_mlp() && m.glu_linear_offset != 0.0)
    return InvalidArgument("--glu-linear-offset ", m.glu_linear_offset,
                           " needs a gated MLP (--swiglu or --quick-geglu), found ",
                           m.squared_relu ? "--squared-relu" : "a GeLU MLP");
  if (clamp && !m.gated_mlp())
    return InvalidArgument("--activation-func-clamp-value ", m.activation_func_clamp_value,
                           " needs a gated MLP (--swiglu or --quick-geglu), found ",
                           m.squared_relu ? "--squared-relu" : "a GeLU MLP");
  if (clamp && !(std::isfinite(m.activation_func_clamp_value) && m.activation_func_clamp_value > 0.0))
    return InvalidArgument("--activation-func-clamp-value: expected a finite number greater than zero, found ",
                           m.activation_func_clamp_value);
  if (clamp && m.swiglu && m.glu_linear_offset != 0.0)
    return InvalidArgument("--glu-linear-offset ", m.glu_linear_offset,
                           " with --swiglu and --activation-func-clamp-value: Megatron requires the offset to be 0 "
                           "for a clamped SwiGLU");
  return Status::Ok();
}

Status validate_glu_moe_args(const Arguments& a) {
  if (a.model.swiglu && !unset(a.model.activation_func_clamp_value) && !a.moe.enabled())
    return InvalidArgument("--activation-func-clamp-value with --swiglu needs --num-experts (Megatron clamps SwiGLU "
                           "only in MoE models), found a dense model");
  return Status::Ok();
}

}  // namespace gale
