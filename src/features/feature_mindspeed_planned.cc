// MindSpeed features Gale knows but does not implement yet: their flags are accepted by the parser
// only to be rejected with "not supported yet", and `gale features` / docs/features.md list them.
#include "features/registry.h"
#include "features/simple_feature.h"

namespace gale {

void register_feature_mindspeed_planned(FeatureRegistry& registry) {
  struct Row {
    const char* name;
    const char* flag;  // nullptr: "--" + name; "": none (only sub-flags)
    FeatureModule module;
    const char* counterpart;
    const char* description;
    std::vector<std::string> sub_flags;
  };
  static const Row rows[] = {
      {"dist-train", nullptr, FeatureModule::kMultimodal, "DistTrainFeature (L2)",
       "several sub-worlds with their own parallel layouts in one job", {}},
  };
  for (const Row& r : rows) {
    SimpleFeatureSpec s;
    s.name = r.name;
    s.flag = r.flag ? r.flag : std::string("--") + r.name;
    s.module = r.module;
    s.level = 2;
    s.counterpart = std::string("MindSpeed ") + r.counterpart;
    s.description = r.description;
    s.implemented = false;
    s.sub_flags = r.sub_flags;
    registry.add(std::make_unique<SimpleFeature>(std::move(s)));
  }
}

}  // namespace gale
