// --use-fused-swiglu: bias + SiLU(gate)·up in one pass (also clamped / offset), forward and backward.
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
      "--glu-linear-offset), forward and backward";
  s.ops = {"swiglu"};
  s.requirement_error = [](const Arguments& a) {
    return a.model.swiglu ? std::string() : std::string("--use-fused-swiglu requires --swiglu");
  };
  registry.add(std::make_unique<KernelFeature>(std::move(s)));
}

}  // namespace gale
