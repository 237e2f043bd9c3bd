// MindSpeed's automated pipeline, memory mode (--automated-pipeline, level 2) in the registry.
//
// What: before training, `gale pretrain` profiles 5 iterations at the even split (the first not
// recorded), searches the layer split and each stage's full-layer recomputation minimising the 1F1B
// step time with every stage's modelled memory under (1 - --save-memory-ratio) x the even split's
// largest, writes the policy to --automated-pipeline-config (a matching entry there is applied
// without profiling) and trains with it from scratch (train/automated_pipeline.h).
//
// Rules (MindSpeed's usage conditions and what its argument checks drop, refused here by name):
// --pipeline-model-parallel-size ≥ 2 and at least one layer per stage; no virtual stages or
// DualPipeV (MindSpeed refuses VPP in the perf mode; the memory mode's search is for 1F1B); none of
// the explicit or uneven split flags (the policy is the split); no --recompute-granularity /
// --recompute-method / --recompute-activation-function / --noop-layers (MindSpeed drops them with a
// warning: the policy decides the recomputation); --save-memory-ratio in [0, 1).
// --automated-pipeline-perf (MindSpeed's performance mode: a micro-batch-size sequence and a
// forward/backward order searched) is refused by the parser as not supported yet
// (train/arguments_automated_pipeline.cc).
//
// Tests: tests/train/automated_pipeline_test.cc (the search and the simulation on synthetic
// profiles, the policy file), tests/features/automated_pipeline_feature_test.cc (rules),
// tests/parallel/automated_pipeline_mpi_test.cc (the profile gathered at PP2 and PP2 x DP2),
// tests/cli/automated_pipeline_cli_test.cc (PP2 under mpirun: the profile gathered, the policy
// applied, losses equal to the same split by hand, the file reused).
#include "features/registry.h"

namespace gale {

namespace {

class AutomatedPipelineFeature : public Feature {
 public:
  std::string name() const override { return "automated-pipeline"; }
  std::string flag() const override { return "--automated-pipeline"; }
  FeatureModule module() const override { return FeatureModule::kParallel; }
  int level() const override { return 2; }
  std::string counterpart() const override { return "MindSpeed automated pipeline (auto-settings group)"; }
  std::string description() const override {
    return "profile 5 iterations, then search the pipeline layer split and per-stage full-layer recomputation "
           "minimising the 1F1B step under a memory limit (--save-memory-ratio); the policy is written to "
           "--automated-pipeline-config and reused";
  }
  bool requested(const FeatureContext& ctx) const override {
    return ctx.args->parallel.automated_pipeline;
  }
  Status validate(const FeatureContext& ctx) const override {
    const Arguments& a = *ctx.args;
    const ParallelArgs& par = a.parallel;
    const int64_t P = par.pipeline_model_parallel_size;
    if (P < 2)
      return InvalidArgument("--automated-pipeline searches the pipeline split: needs --pipeline-model-parallel-size "
                             ">= 2, found ", P);
    if (a.model.num_layers < P)
      return InvalidArgument("--automated-pipeline: needs at least one layer per pipeline stage, found --num-layers ",
                             a.model.num_layers, " on ", P, " stages");
    if (!(par.save_memory_ratio >= 0.0 && par.save_memory_ratio < 1.0))
      return InvalidArgument("--save-memory-ratio: expected a fraction in [0, 1), found ", par.save_memory_ratio);
    for (const char* f : {"--num-layer-list", "--pipeline-num-transformer-layers", "--pipeline-model-parallel-layout",
                          "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
                          "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"})
      if (ctx.parser->was_set(f))
        return InvalidArgument("--automated-pipeline chooses the pipeline split itself: expected no ", f,
                               ", found it set");
    if (par.schedules_method == "dualpipev")
      return InvalidArgument("--automated-pipeline searches the 1F1B schedule's split: expected no --schedules-method "
                             "dualpipev, found it");
    for (const char* f : {"--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank"})
      if (ctx.parser->was_set(f) || par.virtual_pipeline_model_parallel_size > 1)
        return InvalidArgument("--automated-pipeline searches the 1F1B schedule's split: expected no virtual stages, "
                               "found ", ctx.parser->was_set(f) ? f : "virtual stages", " set");
    for (const char* f : {"--recompute-granularity", "--recompute-method", "--recompute-num-layers",
                          "--recompute-activations", "--recompute-activation-function", "--noop-layers"})
      if (ctx.parser->was_set(f))
        return InvalidArgument("--automated-pipeline chooses each stage's recomputation itself (MindSpeed drops ", f,
                               " with a warning): expected no ", f, ", found it set");
    return Status::Ok();
  }
};

}  // namespace

void register_feature_automated_pipeline(FeatureRegistry& registry) {
  registry.add(std::make_unique<AutomatedPipelineFeature>());
}

}  // namespace gale
