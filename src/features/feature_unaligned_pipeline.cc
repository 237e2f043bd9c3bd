// MindSpeed's unaligned PP/VPP split in the registry: the layers of every pipeline stage given explicitly.
//
// `--pipeline-num-transformer-layers '[[0,1],[1,1]*2,[3,0]]'` (MindSpeed) gives the layers of
// every virtual stage, one row per pipeline rank; `--num-layer-list 1,3,3,1` (MindSpeed-LLM's
// spelling) one count per pipeline rank, without virtual stages. The layers keep their global
// numbering (checkpoint names, --noop-layers indices, recomputation, FLOPs), so a checkpoint
// loads at any other split (train/engine.h pipeline_layer_counts). Level 0, unlike MindSpeed's
// level 2: which rank holds which layers must not depend on --optimization-level. The flags
// themselves are parallel flags (train/arguments.cc), validated with the rest of the pipeline
// split (train/arguments_parallel.cc).
#include "features/registry.h"

namespace gale {

namespace {

class UnalignedPipelineFeature : public Feature {
 public:
  std::string name() const override { return "pipeline-num-transformer-layers"; }
  std::string flag() const override { return "--pipeline-num-transformer-layers"; }
  FeatureModule module() const override { return FeatureModule::kParallel; }
  int level() const override { return 0; }
  std::string counterpart() const override {
    return "MindSpeed UnalignedPipelineFeature (L2); MindSpeed-LLM NumLayerListFeature (--num-layer-list)";
  }
  std::string description() const override {
    return "explicit layers of every pipeline rank and virtual stage ([[..],[..]], one row per rank; "
           "--num-layer-list 4,6,6,4 gives one count per rank), global layer numbering unchanged";
  }
  bool requested(const FeatureContext& ctx) const override {
    return !ctx.args->parallel.pipeline_num_transformer_layers.empty() || !ctx.args->parallel.num_layer_list.empty();
  }
  std::string not_requested_reason(const FeatureContext&) const override {
    return "not requested (--pipeline-num-transformer-layers or --num-layer-list)";
  }
};

}  // namespace

void register_feature_unaligned_pipeline(FeatureRegistry& registry) {
  registry.add(std::make_unique<UnalignedPipelineFeature>());
}

}  // namespace gale
