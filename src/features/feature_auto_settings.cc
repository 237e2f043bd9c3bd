// MindSpeed's --auto-settings (AutoSettingsFeature, parallel, level 2) in the registry.
//
// What: `gale pretrain --auto-settings ...` (or `gale auto-settings ...`) does not train: it runs
// small profiling runs of the model (1 and 2 layers; TP = CP = 1 and, on 2 or more local ranks
// (--nproc-per-node), TP = 2 and CP = 2; each writing a --prof-file profile), fits a memory model
// (persistent bytes per parameter, activation bytes per layer and in-flight micro-batch) and a
// step-time model (compute per layer split over TP·CP, TP/CP traffic over the measured bandwidth,
// pipeline bubble, DP gradient reduction, optimizer) to them, searches every TP × CP × PP × DP
// layout of --auto-settings-ranks ranks on --target-nnodes nodes that fits the memory limit, writes
// auto_settings.json to --auto-settings-work-dir and prints the best command line
// (train/auto_settings.h, docs/auto_settings.md).
//
// How it differs from MindSpeed: one scheme, white (the fitted models); --auto-settings-type
// black and mixed are not supported yet. The search covers TP, CP, PP and DP (not EP, VPP,
// micro-batch size or recomputation); the profiling runs use the local ranks only, so the
// inter-node bandwidth is the measured intra-node one times --auto-settings-inter-node-bandwidth-ratio.
//
// Rules: its sub-flags need it; it runs as one process; not with MoE, virtual pipeline stages,
// explicit pipeline splits, other schedules or DPO (train/auto_settings.cc).
//
// Tests: tests/train/auto_settings_test.cc (flags, models and search on synthetic profiles),
// tests/cli/auto_settings_cli_test.cc (the end-to-end run on 2 local ranks; the memory model
// against measured peaks of real runs), tests/features/registry_test.cc.
#include "features/registry.h"

namespace gale {

namespace {

class AutoSettings : public Feature {
 public:
  std::string name() const override { return "auto-settings"; }
  std::string flag() const override { return "--auto-settings"; }
  FeatureModule module() const override { return FeatureModule::kParallel; }
  int level() const override { return 2; }
  std::string counterpart() const override { return "MindSpeed AutoSettingsFeature (L2)"; }
  std::string description() const override {
    return "instead of training: profile small runs of the model (--prof-file), fit memory and step-time models, "
           "search the TP/CP/PP/DP layouts of --auto-settings-ranks ranks on --target-nnodes nodes that fit the "
           "memory, write auto_settings.json and print the best command line (white search only)";
  }
  bool requested(const FeatureContext& ctx) const override { return ctx.args->auto_settings.auto_settings; }
};

}  // namespace

void register_feature_auto_settings(FeatureRegistry& registry) { registry.add(std::make_unique<AutoSettings>()); }

}  // namespace gale
