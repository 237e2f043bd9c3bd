// --use-fusion-attn-v2: MindSpeed's second flash-attention kernel, the one that takes a position bias
// (ALiBi) inside the kernel.
//
// MindSpeed added npu_fusion_attention v2 for ALiBi (its pse / pse_type inputs; the v1 kernel takes
// no bias), and its flag switches --use-flash-attn on with it. Gale has one flash-attention kernel
// family (kernels/cpu/flash_attention_*.cc) and it already takes the ALiBi slopes with the causal,
// document and sliding-window masks, so there is nothing second to write: the flag installs those
// kernels, exactly as --use-flash-attn does, and the two may be given together. Level 2, as
// MindSpeed's; tests/features/kernel_features_test.cc.
#include "features/kernel_feature.h"
#include "features/registry.h"

namespace gale {

void register_feature_use_fusion_attn_v2(FeatureRegistry& registry) {
  KernelFeatureSpec s;
  s.name = "use-fusion-attn-v2";
  s.flag = "--use-fusion-attn-v2";
  s.level = 2;
  s.counterpart = "MindSpeed FusionAttentionV2Feature (L2; npu_fusion_attention v2 with pse)";
  s.description = "flash attention with the position bias in the kernel (ALiBi): Gale's --use-flash-attn kernels take "
                  "the ALiBi slopes themselves, so the flag installs them (as MindSpeed's implies --use-flash-attn)";
  s.ops = {"attention"};
  registry.add(std::make_unique<KernelFeature>(std::move(s)));
}

}  // namespace gale
