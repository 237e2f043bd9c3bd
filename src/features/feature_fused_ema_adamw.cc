// MindSpeed's --optimizer-selection fused_ema_adamw --ema-decay D (FusedEmaAdamwFeature) in the registry.
//
// What: AdamW that also keeps an exponential moving average of the f32 parameters (the "EMA
// weights" diffusion and multimodal training evaluate with), as a third optimizer state tensor,
// "ema_params", updated in the same pass as the AdamW step (optim/optimizer.h OptimizerConfig::ema,
// kernels/cpu/optimizer.h ema_adamw_step_ref and its vectorised twin installed with "adamw").
// Semantics as MindSpeed's FusedEmaAdamW: after applied step t the EMA takes the updated
// parameters, ema ← d_t·ema + (1 − d_t)·p_t with d_t = min(D, (1 + t)/(10 + t)), and it starts as
// the parameters themselves at the first step. Training is fused_adamw's, bit for bit.
//
// Checkpoints: the EMA is optimizer state, `optimizer.ema_params.<name>` with the parameter's global
// shape, sharded like exp_avg under --use-distributed-optimizer and resharded on load; the
// `optimizer` section records `ema_decay`. `gale convert --use-ema` exports the EMA weights to
// Hugging Face safetensors; `gale generate` / `gale evaluate --use-ema` run them (MindSpeed saves an
// `ema_model` state dict next to the model for the same purpose).
//
// Difference from MindSpeed: t is the optimizer's step count, restored on resume, so a resumed run
// continues bit for bit (MindSpeed's num_updates counter is not checkpointed and restarts at 0).
//
// Rules: level 0 (MindSpeed patches the optimizer at every level; Gale's reference kernel runs at
// level 0, the vectorised one from level 1); --ema-decay in [0, 1] (as MindSpeed); --optimizer
// adam only (Muon and SGD have no AdamW step to fuse with); conflicts with --swap-optimizer and
// --reuse-fp32-param (as MindSpeed; MindSpeed's --virtual-optimizer does not exist in Gale).
//
// Tests: tests/kernels/fused_vs_reference_test.cc (EmaAdamW*), tests/optim/optimizer_test.cc
// (EmaAdamW*), tests/train/ema_adamw_test.cc (training, resume, convert), tests/optim/
// ema_adamw_mpi_test.cc (DP2 distributed optimizer), tests/features/fused_ema_adamw_feature_test.cc.
#include "features/registry.h"

namespace gale {

namespace {

class FusedEmaAdamw : public Feature {
 public:
  std::string name() const override { return "fused-ema-adamw"; }
  std::string flag() const override { return "--optimizer-selection"; }
  FeatureModule module() const override { return FeatureModule::kFusedCompute; }
  int level() const override { return 0; }
  std::string counterpart() const override { return "MindSpeed FusedEmaAdamwFeature (L0)"; }
  std::string description() const override {
    return "--optimizer-selection fused_ema_adamw --ema-decay D: AdamW plus an EMA of the fp32 parameters in the same "
           "pass (optimizer state ema_params, sharded and checkpointed like exp_avg; `gale convert --use-ema` "
           "exports it); training bit-identical to fused_adamw";
  }
  bool requested(const FeatureContext& ctx) const override {
    return ctx.args->training.optimizer_selection == "fused_ema_adamw";
  }
  std::string not_requested_reason(const FeatureContext& ctx) const override {
    return "--optimizer-selection is " + ctx.args->training.optimizer_selection;
  }
  Status validate(const FeatureContext& ctx) const override {
    const TrainingArgs& t = ctx.args->training;
    if (!(t.ema_decay >= 0.0 && t.ema_decay <= 1.0))
      return InvalidArgument("--ema-decay: expected a value in [0, 1] (as MindSpeed), found ", t.ema_decay);
    if (t.optimizer != "adam")
      return InvalidArgument("--optimizer-selection fused_ema_adamw: expected --optimizer adam (AdamW), found "
                             "--optimizer ", t.optimizer);
    if (t.swap_optimizer)
      return InvalidArgument("--optimizer-selection fused_ema_adamw: conflicts with --swap-optimizer (as MindSpeed)");
    if (t.reuse_fp32_param)
      return InvalidArgument("--optimizer-selection fused_ema_adamw: conflicts with --reuse-fp32-param (as "
                             "MindSpeed)");
    return Status::Ok();
  }
};

}  // namespace

void register_feature_fused_ema_adamw(FeatureRegistry& registry) { registry.add(std::make_unique<FusedEmaAdamw>()); }

}  // namespace gale
