// MindSpeed features Gale knows but does not implement yet: their flags are accepted by the parser
// only to be rejected with "not supported yet", and `gale features` / docs/features.md list them.
#include "features/registry.h"
#include "features/simple_feature.h"

namespace gale {

void register_feature_mindspeed_planned(FeatureRegistry& registry) {
  struct Row {
    const char* name;
    FeatureModule module;
    const char* counterpart;
    const char* description;
  };
  static const Row rows[] = {
      {"moe-fb-overlap", FeatureModule::kKeyScenarios, "MoEFwdBwdOverlapFeature (L2)",
       "overlap MoE all-to-all of one micro-batch with compute of another"},
      {"use-multiparameter-pipeline-model-parallel", FeatureModule::kMultimodal, "MultiParameterFeature (L2)",
       "pipeline stages exchanging several tensors"},
  };
  for (const Row& r : rows) {
    SimpleFeatureSpec s;
    s.name = r.name;
    s.flag = std::string("--") + r.name;
    s.module = r.module;
    s.level = 2;
    s.counterpart = std::string("MindSpeed ") + r.counterpart;
    s.description = r.description;
    s.implemented = false;
    registry.add(std::make_unique<SimpleFeature>(std::move(s)));
  }
}

}  // namespace gale
