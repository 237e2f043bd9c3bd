// --optimizer-selection (MindSpeed): which fused AdamW kernel updates the flat buffers.
#include "features/registry.h"
#include "kernels/cpu/fused_ops.h"

namespace gale {

namespace {

class OptimizerSelection : public Feature {
 public:
  std::string name() const override { return "optimizer-selection"; }
  std::string flag() const override { return "--optimizer-selection"; }
  FeatureModule module() const override { return FeatureModule::kFusedCompute; }
  int level() const override { return 1; }
  std::string counterpart() const override { return "MindSpeed --optimizer-selection fused_adamw (L0)"; }
  std::string description() const override {
    return "vectorised AdamW over flat buffers and the gradient norm before it (fused_adamw, the default; "
           "fused_torch_adamw is the same kernel; fused_ema_adamw's one-pass AdamW + EMA kernel is installed with it)";
  }
  // --optimizer-selection is a training flag (train/arguments.cc): the optimizer reads it.
  bool requested(const FeatureContext& ctx) const override { return true; }
  bool applicable(const FeatureContext& ctx, std::string* why) const override {
    const std::string& o = ctx.args->training.optimizer;
    if (o != "adam" && o != "muon" && o != "lion") {  // muon, lion: their AdamW part
      *why = "--optimizer is " + ctx.args->training.optimizer;
      return false;
    }
    return true;
  }
  Status apply(const FeatureContext& ctx, EngineSetup& setup) const override {
    return install_fused_kernel(*setup.ops, "adamw", Isa::kAvx512);
  }
};

}  // namespace

void register_feature_optimizer_selection(FeatureRegistry& registry) {
  registry.add(std::make_unique<OptimizerSelection>());
}

}  // namespace gale
