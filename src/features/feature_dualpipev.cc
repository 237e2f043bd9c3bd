// MindSpeed's DualPipeV pipeline schedule (--schedules-method dualpipev) in the feature registry.
//
// The layers are cut into 2·PP equal chunks; pipeline rank r holds chunk r and chunk 2·PP−1−r, so
// rank 0 runs the embedding and the loss and activations go down the ranks and back up
// (train/engine.h chunk_layers, schedule/pipeline_p2p.h StagePlacement::kV). The schedule is
// DeepSeek's DualPipeV order with each overlapped forward/backward pair run forward first
// (schedule/pipeline_order.h dualpipev_order). Layers keep their global numbers, so checkpoints load
// at any other layout. Level 0, unlike MindSpeed's level 2: which rank holds which layers must not
// depend on --optimization-level. The flags are parallel flags (train/arguments.cc), validated
// with the pipeline split (train/arguments_parallel.cc). --dualpipev-dw-detach (MindSpeed's flag,
// DeepSeek's zero-bubble backwards) turns the backwards of DualPipeV's phase 3 and cool-down into
// input-gradient-only steps whose linear weight gradients (attention, MLA, MLP, MoE experts and
// shared expert) run in later W steps (model/weight_grad_store.h); it is refused with LoRA,
// --tp-2d, --swap-attention and --overlap-grad-reduce.
#include "features/registry.h"

namespace gale {

namespace {

class DualPipeVFeature : public Feature {
 public:
  std::string name() const override { return "schedules-method"; }
  std::string flag() const override { return "--schedules-method"; }
  FeatureModule module() const override { return FeatureModule::kParallel; }
  int level() const override { return 0; }
  std::string counterpart() const override { return "MindSpeed DualpipeVFeature (L2)"; }
  std::string description() const override {
    return "--schedules-method dualpipev: DeepSeek's DualPipeV schedule (2 x PP layer chunks, rank r holding "
           "chunks r and 2PP-1-r: rank 0 runs the embedding and the loss; >= 2 x PP micro-batches); "
           "--dualpipev-dw-detach defers the layers' linear weight gradients (attention, MLA, MLP, MoE experts) into the "
           "cool-down's bubbles (not with LoRA, --tp-2d, --swap-attention, --overlap-grad-reduce)";
  }
  bool requested(const FeatureContext& ctx) const override {
    return ctx.args->parallel.schedules_method == "dualpipev";
  }
  std::string not_requested_reason(const FeatureContext&) const override {
    return "not requested (--schedules-method dualpipev)";
  }
};

}  // namespace

void register_feature_dualpipev(FeatureRegistry& registry) { registry.add(std::make_unique<DualPipeVFeature>()); }

}  // namespace gale
