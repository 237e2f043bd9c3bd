// MindSpeed's --enable-expert-placement (ExpertsPlacementFeature) in the registry: migrate experts between EP ranks to balance their loads.
//
// Flags (MindSpeed's): --enable-expert-placement, --expert-placement-freq N (default 50),
// --enable-fine-grained-expert-placement with --fine-grained-expert-placement-thre (default 0.08),
// --print-expert-load. What runs: train/expert_placer.h (EMA load prediction, MindSpeed's greedy
// placement, migration of parameters, gradients and optimizer state over the EP group) and the
// relabelled routing of model/moe_layer.h; docs/parallelism.md §12.
//
// Requirements (one-line errors naming the flag): a MoE model with --expert-model-parallel-size > 1
// and --moe-token-dispatcher-type alltoall; --expert-placement-freq ≥ 1; the fine-grained switch and
// --print-expert-load only with --enable-expert-placement (MindSpeed also prints the load without
// placement: not supported yet). Not supported yet (refused): --use-distributed-optimizer (MindSpeed
// migrates the shards through a DP all-gather; Gale does not yet), the ZeRO-2/3 and FSDP layouts,
// tensor, context and pipeline parallelism, --moe-tp-extend-ep,
// --moe-pad-expert-input-to-capacity, --swap-optimizer, --compress-optimizer, --quant-states and
// --reuse-fp32-param.
#include "features/registry.h"

namespace gale {

namespace {

class EnableExpertPlacementFeature : public Feature {
 public:
  std::string name() const override { return "enable-expert-placement"; }
  std::string flag() const override { return "--enable-expert-placement"; }
  FeatureModule module() const override { return FeatureModule::kKeyScenarios; }
  int level() const override { return 2; }
  std::string counterpart() const override { return "MindSpeed ExpertsPlacementFeature (L2)"; }
  std::string description() const override {
    return "EMA prediction of each expert's load and MindSpeed's greedy re-placement every --expert-placement-freq "
           "steps; experts migrate between EP ranks with their gradients and optimizer state; the same math per "
           "expert (bit-identical losses); needs EP > 1 and alltoall";
  }
  void register_args(ArgParser& parser) override {
    parser.add_flag("--enable-expert-placement", &on_,
                    "MindSpeed: balance the EP ranks' token loads by moving experts between them (needs "
                    "--expert-model-parallel-size > 1 and --moe-token-dispatcher-type alltoall)");
    parser.add("--expert-placement-freq", &freq_, "steps between two re-placements of the experts (default 50)");
    parser.add_flag("--enable-fine-grained-expert-placement", &fine_grained_,
                    "migrate a layer only when the coefficient of variation of its EP ranks' predicted loads drops "
                    "by at least --fine-grained-expert-placement-thre");
    parser.add("--fine-grained-expert-placement-thre", &thre_,
               "the least drop of the coefficient of variation (default 0.08)");
    parser.add_flag("--print-expert-load", &print_,
                    "log each MoE layer's predicted tokens per expert and per EP rank at every re-placement");
  }
  bool requested(const FeatureContext& ctx) const override { return on_ || fine_grained_ || print_; }
  Status validate(const FeatureContext& ctx) const override {
    const Arguments& a = *ctx.args;
    const MoeArgs& m = a.moe;
    const ParallelArgs& par = a.parallel;
    if (!on_)
      return InvalidArgument(fine_grained_ ? "--enable-fine-grained-expert-placement" : "--print-expert-load",
                             " needs --enable-expert-placement, found it off (the load without placement is not "
                             "supported yet)");
    if (m.num_experts <= 0)
      return InvalidArgument("--enable-expert-placement needs --num-experts (a MoE model), found no --num-experts");
    if (par.expert_model_parallel_size <= 1)
      return InvalidArgument("--enable-expert-placement: expected --expert-model-parallel-size greater than 1, found ",
                             par.expert_model_parallel_size);
    if (m.moe_token_dispatcher_type != "alltoall")
      return InvalidArgument("--enable-expert-placement: expected --moe-token-dispatcher-type alltoall, found ",
                             m.moe_token_dispatcher_type);
    if (freq_ < 1)
      return InvalidArgument("--expert-placement-freq: expected a positive integer, found ", freq_);
    if (!(thre_ >= 0.0))
      return InvalidArgument("--fine-grained-expert-placement-thre: expected a number >= 0, found ", thre_);
    const auto no = [](const std::string& what) {
      return Unimplemented("--enable-expert-placement with ", what, ": not supported yet");
    };
    if (par.use_distributed_optimizer && !par.zero2() && !par.zero3())
      return no("--use-distributed-optimizer (migrating the optimizer shards)");
    if (par.zero2() || par.zero3() || par.use_custom_fsdp) return no("--use-custom-fsdp / ZeRO layouts");
    if (par.tensor_model_parallel_size > 1)
      return no(str_cat("--tensor-model-parallel-size ", par.tensor_model_parallel_size));
    if (par.context_parallel_size > 1) return no(str_cat("--context-parallel-size ", par.context_parallel_size));
    if (par.pipeline_model_parallel_size > 1)
      return no(str_cat("--pipeline-model-parallel-size ", par.pipeline_model_parallel_size));
    if (m.moe_tp_extend_ep) return no("--moe-tp-extend-ep");
    if (m.moe_pad_expert_input_to_capacity) return no("--moe-pad-expert-input-to-capacity");
    if (a.training.swap_optimizer) return no("--swap-optimizer");
    if (a.training.compress_optimizer) return no("--compress-optimizer");
    if (!a.training.quant_states.empty()) return no("--quant-states");
    if (a.training.reuse_fp32_param) return no("--reuse-fp32-param");
    return Status::Ok();
  }
  Status apply(const FeatureContext& ctx, EngineSetup& setup) const override {
    setup.ops->expert_placement_freq = freq_;
    setup.ops->expert_placement_fine_grained_thre = fine_grained_ ? thre_ : -1.0;
    setup.ops->print_expert_load = print_;
    return Status::Ok();
  }

 private:
  bool on_ = false;
  int64_t freq_ = 50;
  bool fine_grained_ = false;
  double thre_ = 0.08;
  bool print_ = false;
};

}  // namespace

void register_feature_enable_expert_placement(FeatureRegistry& registry) {
  registry.add(std::make_unique<EnableExpertPlacementFeature>());
}

}  // namespace gale
