// --cross-entropy-loss-fusion: output layer + cross-entropy in token chunks, never materialising
// the [tokens, vocabulary] logits or softmax.
#include "features/kernel_feature.h"
#include "features/registry.h"

namespace gale {

void register_feature_cross_entropy_loss_fusion(FeatureRegistry& registry) {
  KernelFeatureSpec s;
  s.name = "cross-entropy-loss-fusion";
  s.flag = "--cross-entropy-loss-fusion";
  s.level = 2;
  s.counterpart = "Megatron --cross-entropy-loss-fusion; MindSpeed-LLM ChunkLoss";
  s.description = "LM head + cross-entropy fused and chunked over tokens: no [T, V] logits kept, vocab-parallel aware";
  s.ops = {"lm_head_loss"};
  registry.add(std::make_unique<KernelFeature>(std::move(s)));
}

}  // namespace gale
