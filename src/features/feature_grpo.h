// The perform-rl-step feature's flags (features/feature_grpo.cc) for the pretrain driver.
#pragma once

#include "features/registry.h"
#include "train/grpo_args.h"

namespace gale {

// The RL flags the registry's perform-rl-step feature parsed (Megatron's defaults when it is not
// registered, as in a registry built by hand).
const GrpoArgs& grpo_args(const FeatureRegistry& registry);

}  // namespace gale
