// MindSpeed's --recompute-in-bubble (RiPipeSchedulesBubbleFeature, level 2) in the registry.
//
// What: under the interleaved pipeline schedule without recomputation, a rank holds at most
// P·V (pipeline size × virtual stages) chunk activations whole, as MindSpeed promises: walking the
// rank's order, a forward that would exceed that (counting the recomputes already due before its
// backward) keeps only its chunk input, and a recompute step "R c m" rebuilds its activations right
// before its backward "B c m", while the gradient is on its way (the pipeline bubble). Only ranks
// whose warm-up holds more than P·V (2(P−r−1) + (V−1)·P + 1 > P·V: the first ones, from P = 3) recompute
// anything (schedule/pipeline_order.h recompute_in_bubble_order). Lower peak memory there for some
// recompute time; losses and gradients bit-identical to the run without the flag.
//
// Rules, as MindSpeed: needs --pipeline-model-parallel-size > 1 with virtual stages (not
// DualPipeV); conflicts with --recompute-granularity (full or selective: bubble adds recomputation
// where there is none), --swap-attention and --recompute-in-advance. MoE models and
// --swap-layer-input: not supported yet.
//
// Tests: tests/schedule/pipeline_order_test.cc (RiPipe*: held activations bounded by P·V, where
// the R steps go), tests/schedule/ripipe_mpi_test.cc (bit-identical gradients, the allocator's
// peak), tests/features/ripipe_features_test.cc (rules and messages).
#include "features/registry.h"
#include "features/ripipe_rules.h"

namespace gale {

namespace {

class RecomputeInBubble : public Feature {
 public:
  std::string name() const override { return "recompute-in-bubble"; }
  std::string flag() const override { return "--recompute-in-bubble"; }
  FeatureModule module() const override { return FeatureModule::kParallel; }
  int level() const override { return 2; }
  std::string counterpart() const override { return "MindSpeed RiPipeSchedulesBubbleFeature (L2)"; }
  std::string description() const override {
    return "interleaved pipeline without --recompute-granularity: a rank holds at most PP x VPP chunk activations; "
           "forwards beyond keep only their input and recompute in a schedule step before their backward, while "
           "the gradient is on its way; bit-identical training; conflicts with --recompute-in-advance and "
           "--swap-attention";
  }
  bool requested(const FeatureContext& ctx) const override { return ctx.args->model.recompute_in_bubble; }
  Status validate(const FeatureContext& ctx) const override {
    const Arguments& a = *ctx.args;
    GALE_RETURN_IF_ERROR(validate_ripipe_schedule(a, "--recompute-in-bubble"));
    if (!a.model.recompute_granularity.empty())
      return InvalidArgument("--recompute-in-bubble: conflicts with --recompute-granularity ",
                             a.model.recompute_granularity,
                             " (as MindSpeed: it adds recomputation to a run without any; --recompute-in-advance "
                             "schedules full recomputation)");
    if (a.training.swap_attention)
      return InvalidArgument("--recompute-in-bubble: conflicts with --swap-attention (as MindSpeed)");
    if (a.training.swap_layer_input)
      return Unimplemented("--recompute-in-bubble with --swap-layer-input: not supported yet");
    if (a.moe.enabled()) return Unimplemented("--recompute-in-bubble with --num-experts: not supported yet");
    return Status::Ok();
  }
};

}  // namespace

void register_feature_recompute_in_bubble(FeatureRegistry& registry) {
  registry.add(std::make_unique<RecomputeInBubble>());
}

}  // namespace gale
