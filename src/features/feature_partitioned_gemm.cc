// Level 1: f32 GEMMs with the output split over the threads by Gale (sgemm_partitioned).
#include "features/kernel_feature.h"
#include "features/registry.h"

namespace gale {

void register_feature_partitioned_gemm(FeatureRegistry& registry) {
  KernelFeatureSpec s;
  s.name = "partitioned-gemm";
  s.flag = "--no-partitioned-gemm";  // Gale's own: MindSpeed's GEMMs run on NPU/GPU libraries
  s.level = 1;
  s.counterpart = "none (CPU threading of oneDNN sgemm; MindSpeed tunes matmul on the NPU)";
  s.description =
      "linear-layer and LM-head GEMMs split into row or column blocks over the threads (oneDNN sgemm each)";
  s.ops = {"gemm"};
  registry.add(std::make_unique<KernelFeature>(std::move(s)));
}

}  // namespace gale
