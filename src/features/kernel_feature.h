// A fused-compute feature: a flag (or none), a level, model requirements, and the op-table groups
// whose fused kernels it installs (kernels/cpu/fused_ops.h). Each feature_*.cc of the fused-compute
// module is one such description.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "features/feature.h"

namespace gale {

struct KernelFeatureSpec {
  std::string name;
  // Level 2: the flag that enables the feature (MindSpeed's name). Level 1: an optional Megatron
  // flag that switches it off ("--no-bias-gelu-fusion"), or "" when it is always on at level 1.
  std::string flag;
  int level = 2;
  std::string counterpart, description;
  std::vector<std::string> ops;  // op groups of OpTable::impl to install
  // Why the feature does not apply to this model ("" when it does), e.g. "the model uses SwiGLU".
  std::function<std::string(const Arguments&)> not_applicable;
  // For a requested level-2 feature: the error when a requirement is missing ("" when met).
  std::function<std::string(const Arguments&)> requirement_error;
};

class KernelFeature : public Feature {
 public:
  explicit KernelFeature(KernelFeatureSpec spec) : s_(std::move(spec)) {}
  std::string name() const override { return s_.name; }
  std::string flag() const override { return s_.flag; }
  FeatureModule module() const override { return FeatureModule::kFusedCompute; }
  int level() const override { return s_.level; }
  std::string counterpart() const override { return s_.counterpart; }
  std::string description() const override { return s_.description; }
  void register_args(ArgParser& parser) override;
  bool requested(const FeatureContext& ctx) const override { return on_; }
  std::string not_requested_reason(const FeatureContext& ctx) const override;
  Status validate(const FeatureContext& ctx) const override;
  bool applicable(const FeatureContext& ctx, std::string* why) const override;
  Status apply(const FeatureContext& ctx, EngineSetup& setup) const override;

 private:
  KernelFeatureSpec s_;
  bool on_ = false;
};

}  // namespace gale
