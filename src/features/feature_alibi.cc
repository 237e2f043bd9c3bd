// --position-embedding-type alibi (MindSpeed AlibiFeature) in the registry: level 0 here, a model choice.
//
// ALiBi is a model choice that lives in the attention kernels: every reference and flash
// attention kernel adds the per-head bias m_h·(kpos − qpos) to the visible scores
// (AttentionProblem::alibi_slopes, kernels/cpu/attention.h), forward and backward, at global
// positions (context parallelism, KV-cache decoding) and for each rank's own heads (tensor and
// Ulysses head splits). The feature only records the choice and its requirements. MindSpeed
// registers it at level 2 (its patches apply only when --optimization-level >= 2); Gale puts it at
// level 0, as --noop-layers and context parallelism: it changes what the model computes, and the
// plain reference engine (level 0) must compute the same model as the fused one, so the level only
// selects the kernels (reference or flash), never whether the bias is there.
// The flags (--alibi-fusion-attn-type, --square-alibi-mask, --fill-neg-inf,
// --alibi-diagonal-opposite) belong to the model argument group, which validates them
// (train/arguments.cc).
#include "features/registry.h"

namespace gale {

namespace {

class AlibiFeature : public Feature {
 public:
  std::string name() const override { return "position-embedding-type"; }
  std::string flag() const override { return "--position-embedding-type"; }
  FeatureModule module() const override { return FeatureModule::kFusedCompute; }
  int level() const override { return 0; }
  std::string counterpart() const override { return "MindSpeed AlibiFeature (alibi inside fusion attention, pse type 2)"; }
  std::string description() const override {
    return "--position-embedding-type alibi: no position embedding; attention adds the fixed per-head bias "
           "-m_h*(i-j) (Press et al./Bloom slopes, each TP rank its own heads) inside the reference and flash "
           "kernels, forward and backward, at global positions (all context-parallel algorithms, KV-cache "
           "generation), with causal, document and sliding-window masks; refused with MLA and RoPE flags";
  }
  bool requested(const FeatureContext& ctx) const override {
    return ctx.args->model.position_embedding_type == "alibi";
  }
  std::string not_requested_reason(const FeatureContext& ctx) const override {
    return "not requested (--position-embedding-type " + ctx.args->model.position_embedding_type + ")";
  }
};

}  // namespace

void register_feature_alibi(FeatureRegistry& registry) { registry.add(std::make_unique<AlibiFeature>()); }

}  // namespace gale
