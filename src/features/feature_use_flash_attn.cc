// --use-flash-attn: tiled attention with online softmax, O(S) memory, fused forward and backward.
#include "features/kernel_feature.h"
#include "features/registry.h"

namespace gale {

void register_feature_use_flash_attn(FeatureRegistry& registry) {
  KernelFeatureSpec s;
  s.name = "use-flash-attn";
  s.flag = "--use-flash-attn";
  s.level = 2;
  s.counterpart = "MindSpeed FusionAttentionFeature (L2; npu_fusion_attention)";
  s.description = "flash attention: tiled online softmax, causal, document and sliding-window masks (per layer with --window-attn-skip-freq; hidden tiles skipped), GQA, dropout, --softmax-type sink logits (each row's online softmax starts at the sink); O(S) memory per head";
  s.ops = {"attention"};
  registry.add(std::make_unique<KernelFeature>(std::move(s)));
}

}  // namespace gale
