// MindSpeed's --auto-parallel (automatic parallelism, its legacy search; parallel, level 2) in the
// registry.
//
// What: `gale pretrain --auto-parallel --nnodes K --nproc-per-node P ...` does not train: it
// profiles and fits the models of --auto-settings (train/auto_settings_run.h), takes the layouts of
// K × P ranks that fit the memory limit, and runs them for real, chosen by Thompson sampling over
// the predicted step times (train/auto_parallel_search.h), until the draw picks a layout already
// run or --auto-parallel-max-trials runs; writes auto_parallel.json and prints the fastest
// measured layout's command line (train/auto_parallel.h, docs/auto_settings.md §5).
//
// How it differs from MindSpeed: the prior is Gale's fitted step-time model (MindSpeed: an
// operator cost model with uncertainty from single-operator runs); the memory filter is the
// auto-settings memory model (MindSpeed: a grey-box model); Gale stops on convergence or after
// --auto-parallel-max-trials runs (MindSpeed: after at most 8 hours).
//
// Tests: tests/train/auto_settings_test.cc (the sampling on synthetic runs), tests/cli/
// auto_settings_cli_test.cc (an end-to-end run on 2 ranks), tests/features/registry_test.cc.
#include "features/registry.h"

namespace gale {

namespace {

class AutoParallel : public Feature {
 public:
  std::string name() const override { return "auto-parallel"; }
  std::string flag() const override { return "--auto-parallel"; }
  FeatureModule module() const override { return FeatureModule::kParallel; }
  int level() const override { return 2; }
  std::string counterpart() const override { return "MindSpeed automatic parallelism (legacy code path)"; }
  std::string description() const override {
    return "instead of training: profile and fit as --auto-settings, then run the layouts of --nnodes × "
           "--nproc-per-node ranks that fit the memory, chosen by Thompson sampling over the predicted step times, "
           "and print the fastest measured one (auto_parallel.json)";
  }
  bool requested(const FeatureContext& ctx) const override { return ctx.args->auto_settings.auto_parallel; }
};

}  // namespace

void register_feature_auto_parallel(FeatureRegistry& registry) { registry.add(std::make_unique<AutoParallel>()); }

}  // namespace gale
