// MindSpeed's --fix-router (MoEFixRouterFeature) in the registry: a fixed, balanced expert choice for benchmarking.
//
// MindSpeed replaces the top-k indices of Megatron's router by arange(T·k) mod E over the local
// [T, k] choice, so every expert receives the same number of tokens whatever the router learns, and
// keeps the routing weights of the real top-k (so the router still gets gradients). It is meant for
// measuring the dispatch and the experts under a perfectly balanced load, not for training a model.
// Gale does the same in moe_router_forward (model/moe_router.h: pair j of local token row t goes to
// expert (t·k + j) mod E). MindSpeed's rule: it needs --expert-model-parallel-size > 1 (checked in
// train/arguments_moe.cc with the other MoE flags). Level 0 as MindSpeed's: it changes what the
// model computes, so it must not depend on --optimization-level. Tests: tests/model/moe_router_test.cc
// (the choice and the gradient) and tests/features/fix_router_feature_test.cc.
#include "features/registry.h"

namespace gale {

namespace {

class FixRouterFeature : public Feature {
 public:
  std::string name() const override { return "fix-router"; }
  std::string flag() const override { return "--fix-router"; }
  FeatureModule module() const override { return FeatureModule::kKeyScenarios; }
  int level() const override { return 0; }
  std::string counterpart() const override { return "MindSpeed MoEFixRouterFeature (L0)"; }
  std::string description() const override {
    return "MoE benchmarking: pair j of local token t goes to expert (t*topk + j) mod E (a balanced load); the "
           "routing weights and their gradient stay those of the real top-k";
  }
  bool requested(const FeatureContext& ctx) const override { return ctx.args->moe.fix_router; }
};

}  // namespace

void register_feature_fix_router(FeatureRegistry& registry) { registry.add(std::make_unique<FixRouterFeature>()); }

}  // namespace gale
