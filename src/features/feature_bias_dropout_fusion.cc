// Level 1: bias + dropout + residual add fused and vectorised (Megatron's default bias-dropout fusion).
#include "features/kernel_feature.h"
#include "features/registry.h"

namespace gale {

void register_feature_bias_dropout_fusion(FeatureRegistry& registry) {
  KernelFeatureSpec s;
  s.name = "bias-dropout-fusion";
  s.flag = "--no-bias-dropout-fusion";
  s.level = 1;
  s.counterpart = "Megatron bias_dropout_fusion (on by default)";
  s.description =
      "bias, dropout and residual add in one vectorised pass, and the embeddings' dropout (vectorised Philox masks)";
  s.ops = {"bias_dropout_add"};
  registry.add(std::make_unique<KernelFeature>(std::move(s)));
}

}  // namespace gale
