// --mla-down-proj-fusion (Megatron-Core's FusedMLASelfAttention): MLA's input norm and q/kv down projections fused.
//
// Megatron's flag (train/arguments_mla.cc parses and checks it: requires --multi-latent-attention
// and --q-lora-rank, the latent widths divisible by the TP size, no FP8/QAT). The feature reports
// it and, at --optimization-level 2, installs it (OpTable::mla_down_proj_fusion): each MLA layer
// then runs the input norm written straight in the GEMM input type and ONE GEMM over
// [linear_q_down_proj; linear_kv_down_proj] (model/mla_down_proj.h). Below level 2 the model runs
// the unfused reference (norm, then two linears) on the same parameters, so results agree to
// rounding either way and checkpoints do not change.
#include "features/registry.h"

namespace gale {

namespace {

class MlaDownProjFusionFeature : public Feature {
 public:
  std::string name() const override { return "mla-down-proj-fusion"; }
  std::string flag() const override { return "--mla-down-proj-fusion"; }
  FeatureModule module() const override { return FeatureModule::kFusedCompute; }
  int level() const override { return 2; }
  std::string counterpart() const override {
    return "Megatron-Core FusedMLASelfAttention (linear_qkv_down_proj, TE LayerNormLinear)";
  }
  std::string description() const override {
    return "MLA's input norm + [q_down; kv_down] down projection as one norm pass (written in the GEMM input type) "
           "and one GEMM, forward and backward; needs --q-lora-rank; checkpoints keep the unfused names";
  }
  bool requested(const FeatureContext& ctx) const override { return ctx.args->model.mla_down_proj_fusion; }
  Status apply(const FeatureContext& ctx, EngineSetup& setup) const override {
    setup.ops->mla_down_proj_fusion = true;
    setup.ops->impl["mla_down_proj"] = "fused";
    return Status::Ok();
  }
};

}  // namespace

void register_feature_mla_down_proj_fusion(FeatureRegistry& registry) {
  registry.add(std::make_unique<MlaDownProjFusionFeature>());
}

}  // namespace gale
