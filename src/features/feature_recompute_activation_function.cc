// --recompute-activation-function: backward recomputes the MLP activation instead of keeping it.
#include "features/recompute_feature.h"

namespace gale {

void register_feature_recompute_activation_function(FeatureRegistry& registry) {
  register_recompute_feature(
      registry, "recompute-activation-function", "MindSpeed RecomputeActivationFeature (L2)",
      "drop the MLP activation's output (GeLU / SwiGLU, [T, F]) after fc2 and recompute it from fc1's output in "
      "backward; [--recompute-activation-function-num-layers N]: first N layers of each chunk",
      &RecomputePlan::activation_layers);
}

}  // namespace gale
