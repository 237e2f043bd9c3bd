// Level 1: one-pass LayerNorm forward/backward, fused with the residual add before it.
#include "features/kernel_feature.h"
#include "features/registry.h"

namespace gale {

void register_feature_fused_layer_norm(FeatureRegistry& registry) {
  KernelFeatureSpec s;
  s.name = "fused-layer-norm";
  s.level = 1;
  s.counterpart = "Megatron/apex FusedLayerNorm; MindSpeed fused norm patch point (L0)";
  s.description = "LayerNorm in one vectorised pass, and residual add + bias + dropout + LayerNorm fused";
  s.ops = {"norm", "bias_dropout_add_norm"};
  s.not_applicable = [](const Arguments& a) {
    return a.model.normalization == "LayerNorm" ? std::string() : std::string("the model uses RMSNorm (see --use-fused-rmsnorm)");
  };
  registry.add(std::make_unique<KernelFeature>(std::move(s)));
}

}  // namespace gale
