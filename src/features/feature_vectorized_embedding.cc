// Level 1: vectorised embedding lookup and gradient scatter-add.
#include "features/kernel_feature.h"
#include "features/registry.h"

namespace gale {

void register_feature_vectorized_embedding(FeatureRegistry& registry) {
  KernelFeatureSpec s;
  s.name = "vectorized-embedding";
  s.level = 1;
  s.counterpart = "MindSpeed ReplaceIndexPutFeature (vocab-parallel embedding rewrite)";
  s.description = "vectorised (vocab-parallel) embedding lookup and deterministic gradient accumulation";
  s.ops = {"embedding"};
  registry.add(std::make_unique<KernelFeature>(std::move(s)));
}

}  // namespace gale
