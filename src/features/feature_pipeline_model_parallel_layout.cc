// Megatron's --pipeline-model-parallel-layout in the registry: every pipeline stage's layers spelled as symbols.
//
// "Et*3|(tt|)*29,m|L": stages split by '|' in Megatron's order (stage k is virtual stage k / PP of
// pipeline rank k mod PP), E the embedding, t a decoder layer, m an MTP layer, L the loss; the
// stage count / PP is the virtual pipeline size (train/pipeline_layout.h has the grammar and the
// rules). It places the layers like MindSpeed's --pipeline-num-transformer-layers (the same
// train/engine.h placement from ParallelArgs::pipeline_layers), so layers keep their global numbers
// and checkpoints load at any other split. Megatron's rules: no more than one of it,
// --num-layers-per-virtual-pipeline-stage and --num-virtual-stages-per-pipeline-rank; the other
// explicit and uneven split flags are refused with it. Gale runs MTP beside the loss, so every m
// must be in the last stage. MindSpeed's PipelineModelParallelLayoutFeature is level 0 too. Tests:
// tests/train/pipeline_layout_test.cc, tests/train/arguments_parallel_test.cc,
// tests/parallel/invariance_mpi_test.cc (pp2_layout, pp2_vpp2_layout).
#include "features/registry.h"

namespace gale {

namespace {

class PipelineLayoutFeature : public Feature {
 public:
  std::string name() const override { return "pipeline-model-parallel-layout"; }
  std::string flag() const override { return "--pipeline-model-parallel-layout"; }
  FeatureModule module() const override { return FeatureModule::kParallel; }
  int level() const override { return 0; }
  std::string counterpart() const override {
    return "Megatron --pipeline-model-parallel-layout (MindSpeed PipelineModelParallelLayoutFeature, L0)";
  }
  std::string description() const override {
    return "every pipeline stage's layers as symbols (E embedding, t decoder, m MTP, L loss; '|' between stages in "
           "Megatron's order; x*n and (..)*n repeat), the virtual pipeline size from the stage count; MTP beside the "
           "loss";
  }
  bool requested(const FeatureContext& ctx) const override {
    return !ctx.args->parallel.pipeline_model_parallel_layout.empty();
  }
};

}  // namespace

void register_feature_pipeline_model_parallel_layout(FeatureRegistry& registry) {
  registry.add(std::make_unique<PipelineLayoutFeature>());
}

}  // namespace gale
