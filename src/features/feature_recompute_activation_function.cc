// --recompute-activation-function: backward recomputes the MLP activation instead of keeping it.
#include "features/recompute_feature.h"
#include "features/registry.h"

namespace gale {

void register_feature_recompute_activation_function(FeatureRegistry& registry) {
  RecomputeFeatureSpec s;
  s.name = "recompute-activation-function";
  s.counterpart = "MindSpeed RecomputeActivationFeature (L2)";
  s.description =
      "drop the MLP activation's output (GeLU / SwiGLU, [T, F]) after fc2 and recompute it from fc1's output in "
      "backward; [--recompute-activation-function-num-layers N]: first N layers of each chunk";
  s.layers = &RecomputePlan::activation_layers;
  registry.add(std::make_unique<RecomputeFeature>(std::move(s)));
}

}  // namespace gale
