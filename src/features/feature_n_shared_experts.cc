// MindSpeed's --n-shared-experts K (MoESharedExpertsFeature, L0) in the registry: DeepSeekMoE's K shared experts as Megatron's one shared expert of K times the FFN size.
//
// What: MindSpeed (and MindSpeed-LLM, which inherits the feature) converts K before validation into
// Megatron's --moe-shared-expert-intermediate-size = K · --ffn-hidden-size (MindSpeed multiplies
// --ffn-hidden-size, not --moe-ffn-hidden-size; Megatron's default moe-ffn-hidden-size is the
// same value). K experts side by side with a summed output are one MLP whose hidden size is the
// sum of theirs, so Gale runs the shared expert of model/moe_shared_expert.h with that size;
// training is the same as with the explicit Megatron flag (tests/train/n_shared_experts_test.cc).
// The conversion lives in train/arguments_moe.cc (resolve_n_shared_experts), before the shared
// expert's own rules (no biases, divisible by TP, the gate and overlap flags need it).
//
// Rules, as MindSpeed: K and --moe-shared-expert-intermediate-size together are refused (even when
// they agree: "give one of them"); K = 0 means none (MindSpeed's falsy test); a negative K and K
// without --num-experts are one-line errors. MindSpeed also fills n_shared_experts back from the
// Megatron flag (Fs // ffn), which only its DeepSeek-legacy models read; Gale has none of them.
#include "features/registry.h"

namespace gale {

namespace {

class NSharedExpertsFeature : public Feature {
 public:
  std::string name() const override { return "n-shared-experts"; }
  std::string flag() const override { return "--n-shared-experts"; }
  FeatureModule module() const override { return FeatureModule::kKeyScenarios; }
  int level() const override { return 0; }
  std::string counterpart() const override { return "MindSpeed MoESharedExpertsFeature (L0)"; }
  std::string description() const override {
    return "DeepSeekMoE shared experts by count: --n-shared-experts K = --moe-shared-expert-intermediate-size "
           "K x --ffn-hidden-size (not both)";
  }
  bool requested(const FeatureContext& ctx) const override {
    return ctx.parser->was_set("--n-shared-experts") && ctx.args->moe.n_shared_experts > 0;
  }
};

}  // namespace

void register_feature_n_shared_experts(FeatureRegistry& registry) {
  registry.add(std::make_unique<NSharedExpertsFeature>());
}

}  // namespace gale
