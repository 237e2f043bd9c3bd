// One acceleration feature of the MindSpeed design: its flag, module, level, requirements,
// conflicts, and what it installs into the engine.
//
// Activation (as MindSpeed's MindSpeedFeature.is_need_apply):
//   level 0  always active: part of the plain reference engine;
//   level 1  active when --optimization-level >= 1 (always-safe fused / vectorised rewrites;
//            some may be switched off by a Megatron --no-... flag);
//   level 2  active when --optimization-level >= 2 AND its own flag is given.
// A feature whose flag is given but cannot be active (level too low, an ISA the CPU lacks) says so
// at start-up; a requested feature whose requirements are not met (e.g. --use-fused-swiglu
// without --swiglu) or that conflicts with another is an error naming both flags.
//
// To add a feature: write src/features/feature_<name>.cc defining a Feature subclass and
// `void register_feature_<name>(FeatureRegistry&)`; the build finds it (src/CMakeLists.txt).
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "kernels/op_table.h"
#include "model/config.h"
#include "train/arg_parser.h"
#include "train/arguments.h"

namespace gale {

// MindSpeed's seven feature modules.
enum class FeatureModule { kMegatron, kParallel, kMemory, kFusedCompute, kCommunication, kKeyScenarios, kMultimodal };
const char* feature_module_name(FeatureModule m);

// What a feature may read while deciding and validating.
struct FeatureContext {
  const Arguments* args = nullptr;
  const ArgParser* parser = nullptr;
  int optimization_level = 2;
  std::string cpu_isa;  // "avx512", "avx2" or "scalar": the best the CPU and build support
};

// What a feature may change in the engine.
struct EngineSetup {
  OpTable* ops = nullptr;
  RecomputePlan* recompute = nullptr;  // activations backward recomputes (memory features); may be null
};

struct FeatureStatus {
  bool active = false;
  std::string why;  // for inactive features: why not; for active ones: what runs (optional)
};

class Feature {
 public:
  virtual ~Feature() = default;

  // The feature's name = its flag without the dashes where it has one ("use-flash-attn").
  virtual std::string name() const = 0;
  // The flag that requests it ("--use-flash-attn"), or "" for features without one.
  virtual std::string flag() const { return ""; }
  virtual FeatureModule module() const = 0;
  virtual int level() const = 0;
  // MindSpeed / Megatron counterpart, for docs ("MindSpeed FusionAttentionFeature, L2").
  virtual std::string counterpart() const = 0;
  virtual std::string description() const = 0;
  // False for features Gale lists (so their flags are known) but does not implement: planned ones
  // ("not supported yet") and those that have no meaning outside Ascend NPUs or PyTorch.
  virtual bool implemented() const { return true; }
  // For an unimplemented feature: "" if it is planned, else why Gale does not have it at all
  // ("Ascend HCCL's per-group buffers; ..."). Its flags are then refused as "not available".
  virtual std::string not_available_reason() const { return ""; }
  // For an unimplemented feature: its other flags (sub-options), refused with the same reason.
  virtual std::vector<std::string> sub_flags() const { return {}; }

  // Register the feature's own flags (bound to members of the feature object).
  virtual void register_args(ArgParser& parser) {}
  // For level-2 features: whether the user asked for it (its flag). Level 0/1: always true
  // unless switched off by a flag.
  virtual bool requested(const FeatureContext& ctx) const = 0;
  // Why a feature that is not requested is off ("not requested (--use-flash-attn)", "switched off
  // by --no-bias-gelu-fusion", "the model has no RoPE").
  virtual std::string not_requested_reason(const FeatureContext& ctx) const {
    return flag().empty() ? "not requested" : "not requested (" + flag() + ")";
  }
  // Requirements and conflicts of a requested feature; an error names the flags involved.
  virtual Status validate(const FeatureContext& ctx) const { return Status::Ok(); }
  // Whether it can run here even though requested and valid (model shape, CPU); `why` when not.
  virtual bool applicable(const FeatureContext& ctx, std::string* why) const { return true; }
  // Install what the feature provides. Called only for active features, in registry order.
  virtual Status apply(const FeatureContext& ctx, EngineSetup& setup) const { return Status::Ok(); }
};

}  // namespace gale
