// MindSpeed's --moe-tp-extend-ep (MoETpExtendEpFeature) in the registry: the TP ranks split the experts, not their weights.
//
// MindSpeed gives TP rank t of EP rank r the E/(TP·EP) experts starting at (r·TP + t)·E/(TP·EP),
// exchanges the tokens over the tensor-and-expert group (TP ranks fastest) and runs the experts
// whole. That is Megatron-Core's --expert-tensor-parallel-size 1 with an expert-parallel size of
// TP·EP: the expert generator's ep coordinate of a rank is t + TP·r, its EP groups are the same
// ranks in the same order, and expert-DP is world/(TP·EP·PP) either way. Gale implements it as that
// mapping (train/arguments.h expert_grid_ep_size; the layer and groups of docs/parallelism.md §13):
// nothing else changes, and checkpoints store the experts under their global index, so they load
// into any other layout. Requirements and conflicts as MindSpeed's validate_args (one-line errors,
// train/arguments_moe.cc): --num-experts divisible by TP·EP, --moe-permutation-async-comm (accepted
// without effect) and --moe-grouped-gemm, no --moe-expert-capacity-factor, the alltoall dispatcher
// (its documentation), and --expert-tensor-parallel-size 1 or unset.
//
// Level 0, unlike MindSpeed's level 2: the flag selects which ranks hold which experts, so the
// world-size checks and the checkpoint writers depend on it, and that must not change with
// --optimization-level (as --noop-layers and context parallelism).
#include "features/registry.h"

namespace gale {

namespace {

class MoeTpExtendEpFeature : public Feature {
 public:
  std::string name() const override { return "moe-tp-extend-ep"; }
  std::string flag() const override { return "--moe-tp-extend-ep"; }
  FeatureModule module() const override { return FeatureModule::kKeyScenarios; }
  int level() const override { return 0; }
  std::string counterpart() const override { return "MindSpeed MoETpExtendEpFeature (L2)"; }
  std::string description() const override {
    return "split experts (not expert weights) over TP ranks: Megatron's --expert-tensor-parallel-size 1 with "
           "expert-parallel size TP x --expert-model-parallel-size on the same ranks";
  }
  bool requested(const FeatureContext& ctx) const override { return ctx.args->moe.moe_tp_extend_ep; }
};

}  // namespace

void register_feature_moe_tp_extend_ep(FeatureRegistry& registry) {
  registry.add(std::make_unique<MoeTpExtendEpFeature>());
}

}  // namespace gale
