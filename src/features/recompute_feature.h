// A memory feature that drops one kind of activation in forward and recomputes it in backward
// (MindSpeed's --recompute-activation-function, --recompute-norm): its flag, an optional
// "<flag>-num-layers k" (the first k layers of each model chunk; every layer without it), and the
// RecomputePlan field it sets.
#pragma once

#include <cstdint>
#include <string>

#include "features/feature.h"

namespace gale {

struct RecomputeFeatureSpec {
  std::string name;  // = the flag without dashes ("recompute-norm")
  std::string counterpart, description;
  int64_t RecomputePlan::*layers = nullptr;  // the plan's count this feature sets
};

class RecomputeFeature : public Feature {
 public:
  explicit RecomputeFeature(RecomputeFeatureSpec spec) : s_(std::move(spec)) {}
  std::string name() const override { return s_.name; }
  std::string flag() const override { return "--" + s_.name; }
  std::string num_layers_flag() const { return flag() + "-num-layers"; }
  FeatureModule module() const override { return FeatureModule::kMemory; }
  int level() const override { return 2; }
  std::string counterpart() const override { return s_.counterpart; }
  std::string description() const override { return s_.description; }
  void register_args(ArgParser& parser) override;
  // Requested by either flag, so that a layer count without the feature's flag is an error.
  bool requested(const FeatureContext& ctx) const override;
  Status validate(const FeatureContext& ctx) const override;
  Status apply(const FeatureContext& ctx, EngineSetup& setup) const override;

 private:
  RecomputeFeatureSpec s_;
  bool on_ = false;
  int64_t num_layers_ = -1;  // -1: every layer
};

class FeatureRegistry;
// Adds a RecomputeFeature named `name` that sets `layers` of the engine's RecomputePlan.
void register_recompute_feature(FeatureRegistry& registry, std::string name, std::string counterpart,
                                std::string description, int64_t RecomputePlan::*layers);

}  // namespace gale
