// --enable-expert-placement (MindSpeed's ExpertsPlacementFeature): after every optimizer step the
// EMA load prediction of each MoE layer; every --expert-placement-freq steps the greedy re-placement
// and the migration of the moved experts' parameters, gradients and optimizer state.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/moe_layer.h"

namespace gale {

struct Engine;  // train/engine.h

// The flags of the feature (features/feature_enable_expert_placement.cc).
struct ExpertPlacementConfig {
  int64_t freq = 50;                 // --expert-placement-freq: re-place after every freq-th step
  bool fine_grained = false;         // --enable-fine-grained-expert-placement
  double fine_grained_thre = 0.08;   // --fine-grained-expert-placement-thre: the least drop of the CV to migrate
  bool print_load = false;           // --print-expert-load
};

// What one re-placement of one layer found (for the log and the tests).
struct ExpertPlacementReport {
  int64_t step = 0;                    // optimizer steps taken
  int64_t layer = 0;                   // global layer
  std::vector<double> predicted;       // [E] the EMA load per global expert
  std::vector<double> before, after;   // [EP] per-rank predicted load under the old and the new placement
  double cv_before = 0.0, cv_after = 0.0;
  bool migrated = false;               // the placement changed (fine-grained: and the CV dropped enough)
  double migration_seconds = 0.0;      // wall time of the migration (0 when kept)
};

// Drives the placement of every MoE layer of an engine (alltoall dispatcher, plain optimizer; the
// feature refuses the rest). Load statistic: each layer counts its kept (token, expert) pairs in the
// training forwards; after each step they are summed over the data-parallel group and divided by
// the expert-data-parallel size (the tokens one EP group routed to each expert), and
// predicted = 0.9·predicted + 0.1·load. Every freq-th step (optimizer steps taken % freq == 0) the
// greedy placement (model/expert_placement.h) of the prediction replaces the current one when it
// differs (fine-grained: and the coefficient of variation of the per-rank loads drops by at least
// the threshold). Migration: each EP rank packs its slots' parameters, gradients and every
// optimizer state tensor (under LoRA: the frozen expert's values and its adapters' values, gradients
// and state), the EP group all-gathers them, and each rank takes the experts of its new
// slots; the slots' checkpoint names (ParamSpec::global_name) follow, so a checkpoint stores every
// expert under its global index as without placement. A resumed run starts from the identity
// placement and a zero prediction (the experts still load by global index).
class ExpertPlacer {
 public:
  ExpertPlacer(const ExpertPlacementConfig& config, Engine& engine);
  // After each optimizer step (train/grad_sync.cc optimizer_step).
  void after_step(Engine& engine);
  const std::vector<ExpertPlacementReport>& reports() const { return reports_; }
  // The placement of every placed layer of this rank, (global layer, ids).
  const std::vector<std::pair<int64_t, MoeParamIds*>>& layers(size_t chunk) const { return layers_.at(chunk); }

 private:
  void migrate(Engine& engine, size_t chunk, MoeParamIds& w, const std::vector<int32_t>& physical);

  ExpertPlacementConfig config_;
  std::vector<std::vector<std::pair<int64_t, MoeParamIds*>>> layers_;  // per chunk
  std::vector<ExpertPlacementReport> reports_;
  int64_t last_placed_step_ = -1;
};

// "…local_experts.{old}.rest" -> "…local_experts.{expert}.rest".
std::string renamed_expert(const std::string& name, int64_t expert);

}  // namespace gale
