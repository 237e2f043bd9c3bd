// Level 1: bias add + exact GeLU (or --quick-geglu's gated quick GeLU) fused and vectorised (Megatron's default
// bias-gelu fusion).
#include "features/kernel_feature.h"
#include "features/registry.h"

namespace gale {

void register_feature_bias_gelu_fusion(FeatureRegistry& registry) {
  KernelFeatureSpec s;
  s.name = "bias-gelu-fusion";
  s.flag = "--no-bias-gelu-fusion";
  s.level = 1;
  s.counterpart = "Megatron bias_gelu_fusion (on by default)";
  s.description =
      "bias add and exact-erf GeLU fused and vectorised; with --quick-geglu the gated quick GeLU (with "
      "--glu-linear-offset and --activation-func-clamp-value), forward and backward";
  s.ops = {"gelu"};
  s.not_applicable = [](const Arguments& a) {
    if (a.model.swiglu) return std::string("the model uses SwiGLU");
    if (a.model.openai_gelu) return std::string("--openai-gelu: the tanh GeLU has only the reference kernel");
    if (a.model.geglu || a.model.gelu_tanh)
      return std::string(a.model.geglu ? "--geglu" : "--gelu-tanh") +
             ": GeGLU's fused kernel comes with --use-fused-swiglu (level 2)";
    if (a.model.squared_relu) return std::string("--squared-relu: the model has no GeLU");
    return std::string();
  };
  registry.add(std::make_unique<KernelFeature>(std::move(s)));
}

}  // namespace gale
