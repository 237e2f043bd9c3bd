// Megatron's precision-aware optimizer and bf16 gradient reduction (Megatron, level 0) in the registry.
//
// What: --use-precision-aware-optimizer (Megatron core_v0.12.1 over Transformer Engine's FusedAdam)
// stores Adam's moments in --exp-avg-dtype / --exp-avg-sq-dtype: fp32 (as without it), fp16 or fp8
// (E4M3), each fp16/fp8 moment of a segment (the piece of one parameter this rank's distributed
// optimizer updates: TE's "tensor") with one f32 scale amax / R (R = 32752 for fp16, 448 for fp8),
// renewed at every step; the step dequantises the segment's moments to f32, runs the fused AdamW and
// quantises them again (kernels/cpu/scaled_states.h; optim/optimizer.h OptimizerConfig::exp_avg_dtype).
// State per element and moment: 2 bytes (fp16) or 1 (fp8) instead of 4, plus 4 bytes per segment.
// --grad-reduce-in-bf16, and --main-grads-dtype bf16 (Megatron: the main gradients are then the bf16
// gradient buffer itself), reduce the gradients over data parallelism in bf16 under --bf16
// (TrainingArgs::bf16_grad_reduce; optim/data_parallel_sync.h DataParallelConfig::reduce_in_bf16).
//
// Megatron's rules (megatron/training/arguments.py, megatron/core/optimizer/optimizer_config.py):
// without --use-precision-aware-optimizer every dtype must be fp32; with it, --optimizer adam and
// --use-distributed-optimizer; under --bf16, --accumulate-allreduce-grads-in-fp32 needs
// --main-grads-dtype fp32; --grad-reduce-in-bf16 overrides --accumulate-allreduce-grads-in-fp32.
// Without --bf16 the gradient flags change nothing (Megatron's buffer then has the parameters' dtype).
//
// Gale's own limits (refused naming the flags): --main-params-dtype fp16 (not supported yet: Gale's
// master weights are the model's f32 buffer); with --quant-states, --quant-grads (MindSpeed's own
// moment and gradient formats: use one), --swap-optimizer, --compress-optimizer, fused_ema_adamw;
// ZeRO-2/3 layouts (not supported yet). --grad-reduce-in-bf16 / --main-grads-dtype bf16: not with
// --quant-grads, ZeRO-2/3, --num-distributed-optimizer-instances > 1 or --dualpipev-dw-detach (not
// supported yet). Each micro-batch's accumulation is rounded to bf16 in the f32 buffer, as
// Megatron's bf16 buffer holds it (DataParallelSync::round_grads_to_bf16).
//
// Tests: tests/kernels/scaled_states_test.cc (codec vs the numpy fixture, the step vs the f32 step
// within the format's bound), tests/train/precision_aware_optimizer_test.cc (training within
// tolerance of fp32, exact state bytes, bitwise resume, validation messages),
// tests/optim/precision_aware_mpi_test.cc (DP2 distributed optimizer vs one process; bf16 reduction
// vs fp32 within a bf16 bound).
#include "features/registry.h"

namespace gale {

namespace {

class PrecisionAwareOptimizer : public Feature {
 public:
  std::string name() const override { return "precision-aware-optimizer"; }
  std::string flag() const override { return "--use-precision-aware-optimizer"; }
  FeatureModule module() const override { return FeatureModule::kMegatron; }
  int level() const override { return 0; }
  std::string counterpart() const override { return "Megatron --use-precision-aware-optimizer (TE FusedAdam)"; }
  std::string description() const override {
    return "Adam's moments stored as fp16 (scaled to 32752) or fp8 E4M3 (scaled to 448) with one f32 scale per "
           "optimizer segment, dequantised for each fused AdamW step (--exp-avg-dtype, --exp-avg-sq-dtype; 2x or 4x "
           "less state per moment); --grad-reduce-in-bf16 / --main-grads-dtype bf16: with --bf16 the data-parallel "
           "gradient reduction in bf16";
  }
  bool requested(const FeatureContext& ctx) const override {
    const TrainingArgs& t = ctx.args->training;
    return t.use_precision_aware_optimizer || t.grad_reduce_in_bf16 || t.main_grads_dtype != "fp32" ||
           t.main_params_dtype != "fp32" || t.exp_avg_dtype != "fp32" || t.exp_avg_sq_dtype != "fp32";
  }
  Status validate(const FeatureContext& ctx) const override {
    const Arguments& a = *ctx.args;
    const TrainingArgs& t = a.training;
    const ParallelArgs& p = a.parallel;
    if (!t.use_precision_aware_optimizer) {
      for (const auto& [flag, value] : dtype_flags(t))
        if (value != "fp32")
          return InvalidArgument(flag, " ", value, ": can only be fp32 when not using the precision-aware optimizer "
                                 "(Megatron's rule); add --use-precision-aware-optimizer");
    } else {
      if (t.optimizer != "adam")
        return InvalidArgument("--use-precision-aware-optimizer: only supported with --optimizer adam (Megatron's "
                               "rule), found --optimizer ", t.optimizer);
      if (!p.use_distributed_optimizer)
        return InvalidArgument("--use-precision-aware-optimizer: only supported with the distributed optimizer "
                               "(Megatron's rule); add --use-distributed-optimizer");
      if (t.main_params_dtype != "fp32")
        return Unimplemented("--main-params-dtype ", t.main_params_dtype, ": not supported yet (Gale's master "
                             "weights are the model's f32 buffer); expected fp32");
      if (!t.quant_states.empty())
        return InvalidArgument("--use-precision-aware-optimizer: conflicts with --quant-states ", t.quant_states,
                               " (both choose how Adam's moments are stored); use one of them");
      if (t.quant_grads)
        return InvalidArgument("--use-precision-aware-optimizer: conflicts with --quant-grads (MindSpeed's FP16 main "
                               "gradients feed its own AdamW); use one of them");
      if (t.swap_optimizer)
        return InvalidArgument("--use-precision-aware-optimizer: conflicts with --swap-optimizer (the swapped state "
                               "is f32); use one of them");
      if (t.compress_optimizer)
        return InvalidArgument("--use-precision-aware-optimizer: conflicts with --compress-optimizer (it compresses "
                               "f32 state); use one of them");
      if (t.optimizer_selection == "fused_ema_adamw")
        return Unimplemented("--use-precision-aware-optimizer with --optimizer-selection fused_ema_adamw: not "
                             "supported yet (the fused EMA kernel reads f32 moments)");
      if (p.zero2() || p.zero3())
        return Unimplemented("--use-precision-aware-optimizer with ZeRO-2/3 (", zero_flag(a), "): not supported yet "
                             "(use --use-distributed-optimizer)");
    }
    // megatron/training/arguments.py, under --bf16.
    if (t.bf16 && t.accumulate_allreduce_grads_in_fp32 && t.main_grads_dtype != "fp32")
      return InvalidArgument("--main-grads-dtype ", t.main_grads_dtype, ": can only be fp32 when "
                             "--accumulate-allreduce-grads-in-fp32 is set (Megatron's rule)");
    if (t.bf16_grad_reduce()) {
      const std::string what = t.grad_reduce_in_bf16 ? "--grad-reduce-in-bf16" : "--main-grads-dtype bf16";
      if (t.quant_grads)
        return InvalidArgument(what, ": conflicts with --quant-grads (FP16 main gradients); use one of them");
      if (p.zero2() || p.zero3())
        return Unimplemented(what, " with ZeRO-2/3 (", zero_flag(a), "): not supported yet");
      if (p.num_distributed_optimizer_instances > 1)
        return Unimplemented(what, " with --num-distributed-optimizer-instances ",
                             p.num_distributed_optimizer_instances, ": not supported yet; expected 1");
      if (p.dualpipev_dw_detach)
        return Unimplemented(what, " with --dualpipev-dw-detach: not supported yet (the detached weight gradients "
                             "arrive after each micro-batch's bf16 rounding)");
    }
    return Status::Ok();
  }

 private:
  static std::vector<std::pair<std::string, std::string>> dtype_flags(const TrainingArgs& t) {
    return {{"--main-grads-dtype", t.main_grads_dtype},
            {"--main-params-dtype", t.main_params_dtype},
            {"--exp-avg-dtype", t.exp_avg_dtype},
            {"--exp-avg-sq-dtype", t.exp_avg_sq_dtype}};
  }
  static std::string zero_flag(const Arguments& a) {
    if (a.parallel.layerzero) return "--layerzero";
    if (a.parallel.use_torch_fsdp2) return "--use-torch-fsdp2";
    return "--data-parallel-sharding-strategy " + a.parallel.data_parallel_sharding_strategy;
  }
};

}  // namespace

void register_feature_precision_aware_optimizer(FeatureRegistry& registry) {
  registry.add(std::make_unique<PrecisionAwareOptimizer>());
}

}  // namespace gale
