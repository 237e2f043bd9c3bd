// --use-fused-rmsnorm: one-pass RMSNorm forward/backward, fused with the residual add before it.
#include "features/kernel_feature.h"
#include "features/registry.h"

namespace gale {

void register_feature_use_fused_rmsnorm(FeatureRegistry& registry) {
  KernelFeatureSpec s;
  s.name = "use-fused-rmsnorm";
  s.flag = "--use-fused-rmsnorm";
  s.level = 2;
  s.counterpart = "MindSpeed fused RMSNorm (npu_rms_norm)";
  s.description = "fused RMSNorm, and residual add + bias + dropout + RMSNorm in one pass";
  s.ops = {"norm", "bias_dropout_add_norm"};
  s.requirement_error = [](const Arguments& a) {
    return a.model.normalization == "RMSNorm" ? std::string() : std::string("--use-fused-rmsnorm requires --normalization RMSNorm");
  };
  registry.add(std::make_unique<KernelFeature>(std::move(s)));
}

}  // namespace gale
