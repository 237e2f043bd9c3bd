// MindSpeed's automated-pipeline flags (features/feature_automated_pipeline.cc, train/automated_pipeline.h).
#include "train/arguments.h"

namespace gale {

void add_automated_pipeline_args(ArgParser& p, ParallelArgs& a) {
  p.group("automated pipeline");
  p.add_flag("--automated-pipeline", &a.automated_pipeline,
             "MindSpeed's automated pipeline (memory mode): profile 5 iterations at the even split, then search the "
             "layer split and per-stage full-layer recomputation minimising the 1F1B step under a memory limit, "
             "record the policy in --automated-pipeline-config and train with it (docs/parallelism.md)");
  p.add_unsupported("--automated-pipeline-perf",
                    "MindSpeed's automated pipeline performance mode searches a micro-batch-size sequence and a "
                    "forward/backward order; use --automated-pipeline, the memory mode");
  p.add("--save-memory-ratio", &a.save_memory_ratio,
        "--automated-pipeline: the memory limit per stage is (1 - this) x the even split's largest stage memory "
        "(MindSpeed's, default 0.20)");
  p.add("--automated-pipeline-config", &a.automated_pipeline_config,
        "Gale: --automated-pipeline's policy file (JSON, docs/formats/automated-pipeline.md; default "
        "autopipeline_config.json, MindSpeed's name, in the working directory): a matching entry is applied without "
        "profiling, a new policy is appended");
}

}  // namespace gale
