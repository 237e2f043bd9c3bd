// MindSpeed's automated pipeline, memory mode (--automated-pipeline): profile, search, policy file.
//
// What MindSpeed does (mindspeed/core/memory/auto_pipeline): before training, a short profiling
// run (5 iterations) measures the layers' forward time and activation memory and the stages'
// parameter memory; rank 0 then searches the layer split and, per stage, how many of its first
// layers recompute (full layers, MLPs or attentions), minimising a 1F1B simulation's step time
// with every stage's modelled memory under (1 - --save-memory-ratio) x the even split's largest;
// the policy goes into autopipeline_config.json (a later run with the same model and layout
// finds it there and skips the profiling), and training restarts from scratch with it.
//
// Gale does the same in-process (run_automated_pipeline, called by `gale pretrain` before it builds
// the engine): profile_pipeline runs kProfileIterations training iterations of a throw-away engine
// at the even split, measuring every layer's forward and backward time and the bytes its forward
// keeps (exact, from the allocator; model/layer_profile.h) plus the embedding's and the head's, and
// gathers the profile to every rank; search_pipeline_policy is a pure function of that profile; the
// real engine is then built with the policy's split (ParallelArgs::pipeline_layers) and per-stage
// full-layer recomputation (ParallelArgs::recompute_layers_per_stage), initialised from --seed as
// any run, so its losses equal those of the same split given by hand. Differences from MindSpeed:
// measured backward times (MindSpeed: 1.3 x forward), full-layer recomputation only (MindSpeed also
// tries MLP-only and attention-only), every split with ≥ 1 layer per stage searched when there are
// at most kMaxFullSearch of them (else MindSpeed's window around L/P), pipeline transfers not
// modelled. The file format: docs/formats/automated-pipeline.md.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "train/arguments.h"
#include "train/engine.h"
#include "train/sample_dataset.h"

namespace gale {

// MindSpeed's profiling length (AutoPipeline.stop_profiling_step); the first iteration warms up
// and is not recorded.
inline constexpr int64_t kProfileIterations = 5;
// Searched exhaustively up to this many splits.
inline constexpr int64_t kMaxFullSearch = 200000;

// What the profiling iterations measured, for the whole model, per micro-batch (the same on every
// rank once gathered).
struct PipelineProfile {
  int64_t num_layers = 0;        // L
  int64_t pipeline_size = 0;     // P
  int64_t num_microbatches = 0;  // M per iteration and data-parallel rank
  std::vector<int64_t> profiled_split;  // layers per stage of the profiling run
  // Per transformer layer (global index): forward and backward seconds, the bytes its forward
  // keeps until its backward, its input's bytes (what full recomputation keeps instead) and its
  // parameters' share of the stage's static bytes (values, gradients, optimizer state).
  std::vector<double> layer_forward_s, layer_backward_s;
  std::vector<int64_t> layer_kept_bytes, layer_input_bytes, layer_static_bytes;
  // The first stage's embedding and the last stage's head (final norm, output layer, loss).
  double embedding_forward_s = 0.0, embedding_backward_s = 0.0, head_forward_s = 0.0, head_backward_s = 0.0;
  int64_t embedding_kept_bytes = 0, head_kept_bytes = 0, embedding_static_bytes = 0, head_static_bytes = 0;
  // Per stage: the allocator's peak over the recorded iterations (the largest of the stage's ranks).
  std::vector<int64_t> measured_peak_bytes;
};

// The search's result.
struct PipelinePolicy {
  std::vector<int64_t> num_layer_list;         // layers per stage
  std::vector<int64_t> recompute_module_list;  // per stage: its first k layers recompute (full layers)
  double step_seconds = 0.0;                   // the 1F1B simulation's step time
  double even_step_seconds = 0.0;              // the same for the profiled (even) split, no recompute
  std::vector<int64_t> stage_bytes;            // the memory model, per stage
  std::vector<int64_t> even_stage_bytes;       // the same for the profiled (even) split, no recompute
  int64_t memory_limit_bytes = 0;
  // false: no split fits the limit even recomputing every layer; the policy is then the one with
  // the smallest largest stage (MindSpeed's fallback, "the minimum memory strategy").
  bool feasible = true;
  int64_t candidates = 0;  // splits evaluated
};

// The step time of 1F1B (Gale's order, schedule/pipeline_order.h) with M micro-batches when stage s
// takes forward_s[s] per forward and backward_s[s] per backward, transfers free: every step starts
// when its rank is free and its input (the previous stage's forward, the next stage's backward) is done.
double simulate_one_f_one_b(const std::vector<double>& forward_s, const std::vector<double>& backward_s,
                            int64_t num_microbatches);

// The memory model of stage `stage` holding layers [first, first + layers) of which the first
// `recompute` recompute: static bytes + min(P − stage, M) micro-batches in flight × the bytes one
// keeps (a recomputed layer keeps its input only; the first stage adds the embedding's, the last
// the head's) + the largest rematerialised layer during a backward.
int64_t stage_memory_bytes(const PipelineProfile& p, int64_t stage, int64_t first, int64_t layers, int64_t recompute);

// The policy for `p`: deterministic (ties: the smaller largest stage, then the first split in
// enumeration order, stage 0's count descending).
PipelinePolicy search_pipeline_policy(const PipelineProfile& p, double save_memory_ratio);

// Runs the profiling iterations on an engine at the even split and gathers the profile (collective
// over `world`). `train` supplies the samples (from the first, as the real run).
StatusOr<PipelineProfile> profile_pipeline(const Arguments& args, const Comm& world, const OpTable& ops,
                                           const EngineOptions& options, const SampleDataset* train);

// The policy file (docs/formats/automated-pipeline.md): the key of a run (model, batch and layout
// sizes, --save-memory-ratio), the policy recorded for that key in `path` (nullopt: no file or no
// entry; an error: not a policy file), and appending one.
nlohmann::json automated_pipeline_key(const Arguments& args);
StatusOr<std::optional<PipelinePolicy>> find_pipeline_policy(const std::string& path, const nlohmann::json& key);
Status append_pipeline_policy(const std::string& path, const nlohmann::json& key, const PipelinePolicy& policy,
                              const PipelineProfile& profile);

// The policy's lines as rank 0 prints them.
std::vector<std::string> describe_pipeline_policy(const PipelinePolicy& policy, bool from_file);

// What run_automated_pipeline tells this rank about its pipeline stage, for the report after training.
struct AutomatedPipelineStage {
  int64_t predicted_bytes = -1;  // the memory model's figure for the policy (-1: not in the file)
  int64_t even_peak_bytes = -1;  // the allocator's peak of the profiling iterations (-1: not profiled)
};

// The whole feature for `gale pretrain`: the policy from --automated-pipeline-config, or profiled,
// searched (rank 0), broadcast, printed and appended there; then args' split and per-stage
// recomputation set from it. Collective over `world`.
StatusOr<AutomatedPipelineStage> run_automated_pipeline(Arguments& args, const Comm& world, const OpTable& ops,
                                                        const EngineOptions& options, const SampleDataset* train);

}  // namespace gale
