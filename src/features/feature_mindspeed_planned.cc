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
      {"adaptive-cp", "", FeatureModule::kParallel, "AdaptiveContextParallelFeature (L2)",
       "mask-aware rescheduling of context-parallel blocks for arbitrary masks (--context-parallel-algo "
       "adaptive_cp_algo or hybrid_adaptive_cp_algo)",
       {"--attention-mask-on-cpu", "--adaptive-cp-without-coarse", "--adaptive-cp-dynamic-attn-mask",
        "--adaptive-cp-only-reschedule", "--adaptive-cp-manually-set-mask-list"}},
      {"auto-parallel", nullptr, FeatureModule::kParallel, "automatic parallelism (legacy code path)",
       "search of the parallel layout with a memory model and an operator cost model", {}},
      {"auto-settings", nullptr, FeatureModule::kParallel, "AutoSettingsFeature (L2)",
       "profile small runs, then search TP/PP/CP/EP and the memory features for a target cluster",
       {"--auto-settings-type", "--auto-settings-work-dir", "--auto-settings-ranks", "--target-nnodes",
        "--prof-file"}},
      {"automated-pipeline", nullptr, FeatureModule::kParallel, "automated pipeline (auto-settings group)",
       "online profiling and pipeline search: uneven layer split, recompute and micro-batch sizes",
       {"--automated-pipeline-perf"}},
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
