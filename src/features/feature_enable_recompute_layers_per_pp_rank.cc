// MindSpeed's --enable-recompute-layers-per-pp-rank (EnableRecomputeLayersPerPPRank, level 2) in the registry.
//
// What: with virtual pipeline stages, --recompute-method block's --recompute-num-layers N counts the
// layers of a pipeline rank (over all its V chunks) instead of each chunk's: layer l of chunk v
// recomputes when l·V + v < N (MindSpeed's recompute priority: the first layer of every chunk, then
// the second of every chunk, ...), so N = 3 with V = 2 recomputes layers 0 and 1 of chunk 0 and layer
// 0 of chunk 1 (model/config.h FullRecompute::group). N ≥ the rank's layers recomputes all of them.
//
// Rules: needs --pipeline-model-parallel-size > 1 with virtual stages and --recompute-granularity
// full --recompute-method block (MindSpeed also lets it count --swap-attention and
// --recompute-activation-function layers: not supported yet, refused without block).
//
// Tests: tests/model/recompute_test.cc (FullRecompute.PerPipelineRank: the groups),
// tests/schedule/ripipe_mpi_test.cc (gradients equal to the run without recompute),
// tests/features/ripipe_features_test.cc (rules and messages).
#include "features/registry.h"

namespace gale {

namespace {

class EnableRecomputeLayersPerPPRank : public Feature {
 public:
  std::string name() const override { return "enable-recompute-layers-per-pp-rank"; }
  std::string flag() const override { return "--enable-recompute-layers-per-pp-rank"; }
  FeatureModule module() const override { return FeatureModule::kMemory; }
  int level() const override { return 2; }
  std::string counterpart() const override { return "MindSpeed EnableRecomputeLayersPerPPRank (L2)"; }
  std::string description() const override {
    return "with virtual pipeline stages and --recompute-method block: --recompute-num-layers N counts the layers "
           "of the pipeline rank, spread over its virtual stages (layer l of stage v recomputes when l x VPP + v < N)";
  }
  bool requested(const FeatureContext& ctx) const override {
    return ctx.args->model.enable_recompute_layers_per_pp_rank;
  }
  Status validate(const FeatureContext& ctx) const override {
    const Arguments& a = *ctx.args;
    if (a.parallel.pipeline_model_parallel_size <= 1 || a.parallel.virtual_pipeline_model_parallel_size <= 1)
      return InvalidArgument("--enable-recompute-layers-per-pp-rank: needs --pipeline-model-parallel-size > 1 with "
                             "virtual stages (--num-layers-per-virtual-pipeline-stage or --num-virtual-stages-per-"
                             "pipeline-rank), found pipeline size ", a.parallel.pipeline_model_parallel_size, " with ",
                             std::max<int64_t>(1, a.parallel.virtual_pipeline_model_parallel_size),
                             " virtual stage(s) per rank");
    if (a.model.recompute_granularity != "full" || a.model.recompute_method != "block")
      return InvalidArgument("--enable-recompute-layers-per-pp-rank: needs --recompute-granularity full "
                             "--recompute-method block (its --recompute-num-layers is what it counts per rank; "
                             "--swap-attention / --recompute-activation-function layer counts: not supported yet), "
                             "found ",
                             a.model.recompute_granularity.empty() ? "no --recompute-granularity"
                             : a.model.recompute_granularity != "full"
                                 ? "--recompute-granularity " + a.model.recompute_granularity
                                 : "--recompute-method " + a.model.recompute_method);
    return Status::Ok();
  }
};

}  // namespace

void register_feature_enable_recompute_layers_per_pp_rank(FeatureRegistry& registry) {
  registry.add(std::make_unique<EnableRecomputeLayersPerPPRank>());
}

}  // namespace gale
