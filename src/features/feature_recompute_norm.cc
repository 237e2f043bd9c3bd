// --recompute-norm: backward recomputes both norms' outputs instead of keeping them.
#include "features/recompute_feature.h"
#include "features/registry.h"

namespace gale {

void register_feature_recompute_norm(FeatureRegistry& registry) {
  RecomputeFeatureSpec s;
  s.name = "recompute-norm";
  s.counterpart = "MindSpeed RecomputeNormFeature (L2)";
  s.description =
      "drop both norms' outputs ([T, H] each) after the QKV and fc1 GEMMs and recompute them from the layer's "
      "input and x_mid in backward; [--recompute-norm-num-layers N]: first N layers of each chunk";
  s.layers = &RecomputePlan::norm_layers;
  registry.add(std::make_unique<RecomputeFeature>(std::move(s)));
}

}  // namespace gale
