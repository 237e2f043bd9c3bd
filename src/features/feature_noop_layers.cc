// MindSpeed's --noop-layers in the registry: identity layers that balance pipeline stages.
//
// `--noop-layers 0,23` makes global layers 0 and 23 the identity: no parameters (their names are
// absent from checkpoints), nothing computed or kept, but they keep their place in the layer
// numbering and in Megatron's pipeline split, so a stage holding the embedding or the output layer
// can be given fewer real layers. The FLOPs of the log line count only the real layers, as
// MindSpeed's. Level 0, unlike MindSpeed's level 2: the flag changes which model is trained, and
// that must not depend on --optimization-level. The flag itself is a model flag (train/arguments.cc)
// so that generate, evaluate and checkpoint tools build the same model.
#include "features/registry.h"

namespace gale {

namespace {

class NoopLayersFeature : public Feature {
 public:
  std::string name() const override { return "noop-layers"; }
  std::string flag() const override { return "--noop-layers"; }
  FeatureModule module() const override { return FeatureModule::kParallel; }
  int level() const override { return 0; }
  std::string counterpart() const override { return "MindSpeed NoopLayersFeature (L2)"; }
  std::string description() const override {
    return "identity layers without parameters at the given global indices, to balance pipeline stages; "
           "FLOPs count the real layers only";
  }
  bool requested(const FeatureContext& ctx) const override { return !ctx.args->model.noop_layers_flag.empty(); }
};

}  // namespace

void register_feature_noop_layers(FeatureRegistry& registry) { registry.add(std::make_unique<NoopLayersFeature>()); }

}  // namespace gale
