// --use-fused-swiglu: bias + SiLU(gate)·up in one pass (also clamped / offset), forward and backward; with
// MindSpeed-LLM's GeGLU (--geglu / --gelu-tanh) the fused bias + GeLU(gate)·up (MindSpeed has no GeGLU feature).
#include "features/kernel_feature.h"
#include "features/registry.h"

namespace gale {

void register_feature_use_fused_swiglu(FeatureRegistry& registry) {
  KernelFeatureSpec s;
  s.name = "use-fused-swiglu";
  s.flag = "--use-fused-swiglu";
  s.level = 2;
  s.counterpart = "MindSpeed FusedSwigluFeature (npu_swiglu)";
  s.description =
      "fused SwiGLU (bias, SiLU of the gate times the up projection; also with --activation-func-clamp-value or "
      "--glu-linear-offset), forward and backward; with --geglu / --gelu-tanh the fused GeGLU (GeLU of the gate, "
      "exact or tanh) instead";
  s.ops = {"swiglu", "geglu"};
  s.requirement_error = [](const Arguments& a) {
    return a.model.swiglu || a.model.geglu || a.model.gelu_tanh
               ? std::string()
               : std::string("--use-fused-swiglu requires --swiglu (or GeGLU: --geglu, --gelu-tanh)");
  };
  registry.add(std::make_unique<KernelFeature>(std::move(s)));
}

}  // namespace gale
