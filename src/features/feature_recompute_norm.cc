// --recompute-norm: backward recomputes both norms' outputs instead of keeping them.
#include "features/recompute_feature.h"

namespace gale {

void register_feature_recompute_norm(FeatureRegistry& registry) {
  register_recompute_feature(
      registry, "recompute-norm", "MindSpeed RecomputeNormFeature (L2)",
      "drop both norms' outputs ([T, H] each) after the QKV and fc1 GEMMs and recompute them from the layer's input "
      "and x_mid in backward; [--recompute-norm-num-layers N]: first N layers of each chunk",
      &RecomputePlan::norm_layers);
}

}  // namespace gale
