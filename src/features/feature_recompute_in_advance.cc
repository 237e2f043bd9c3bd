// MindSpeed's --recompute-in-advance (RiPipeSchedulesAdvanceFeature, level 2) in the registry.
//
// What: under the interleaved pipeline schedule with full recomputation, each (chunk, micro-batch)
// recompute becomes a step "R c m" of the schedule, run right before its backward "B c m" — after
// the gradient's receive was posted, so the rerun overlaps the wait for the gradient from the next
// stage instead of following it — and the last pipeline rank's last virtual stage (the model's
// last layers, whose backwards follow their forwards closely) keeps its activations instead of
// recomputing: a little more memory there, less time on the critical path
// (schedule/pipeline_order.h recompute_in_advance_order, GPTModel::recompute). Losses and
// gradients are bit-identical to the run without the flag (same kernels, same dropout masks).
//
// Rules, as MindSpeed: needs --pipeline-model-parallel-size > 1 with virtual stages (not
// DualPipeV); needs --recompute-granularity full with --recompute-method block (MindSpeed refuses
// uniform and selective); conflicts with --recompute-in-bubble. MoE models and --swap-attention /
// --swap-layer-input: not supported yet.
//
// Tests: tests/schedule/pipeline_order_test.cc (RiPipe*: where the R steps go),
// tests/schedule/ripipe_mpi_test.cc (bit-identical gradients, steps run, held activations),
// tests/features/ripipe_features_test.cc (rules and messages).
#include "features/registry.h"
#include "features/ripipe_rules.h"

namespace gale {

namespace {

class RecomputeInAdvance : public Feature {
 public:
  std::string name() const override { return "recompute-in-advance"; }
  std::string flag() const override { return "--recompute-in-advance"; }
  FeatureModule module() const override { return FeatureModule::kParallel; }
  int level() const override { return 2; }
  std::string counterpart() const override { return "MindSpeed RiPipeSchedulesAdvanceFeature (L2)"; }
  std::string description() const override {
    return "interleaved pipeline with --recompute-granularity full --recompute-method block: each recompute runs "
           "as a schedule step before its backward, overlapping the wait for the gradient; the last rank's last "
           "virtual stage keeps its activations; bit-identical training; conflicts with --recompute-in-bubble";
  }
  bool requested(const FeatureContext& ctx) const override { return ctx.args->model.recompute_in_advance; }
  Status validate(const FeatureContext& ctx) const override {
    const Arguments& a = *ctx.args;
    GALE_RETURN_IF_ERROR(validate_ripipe_schedule(a, "--recompute-in-advance"));
    if (a.model.recompute_granularity != "full" || a.model.recompute_method != "block")
      return InvalidArgument("--recompute-in-advance: needs --recompute-granularity full --recompute-method block (as "
                             "MindSpeed: it schedules those recomputes), found ",
                             a.model.recompute_granularity.empty() ? "no --recompute-granularity"
                             : a.model.recompute_granularity != "full"
                                 ? "--recompute-granularity " + a.model.recompute_granularity
                                 : "--recompute-method " + a.model.recompute_method);
    if (a.moe.enabled())
      return Unimplemented("--recompute-in-advance with --num-experts: not supported yet");
    if (a.training.swap_attention || a.training.swap_layer_input)
      return Unimplemented("--recompute-in-advance with ", a.training.swap_attention ? "--swap-attention" : "--swap-layer-input",
                           ": not supported yet");
    return Status::Ok();
  }
};

}  // namespace

void register_feature_recompute_in_advance(FeatureRegistry& registry) {
  registry.add(std::make_unique<RecomputeInAdvance>());
}

}  // namespace gale
