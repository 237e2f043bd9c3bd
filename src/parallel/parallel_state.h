// This rank's place in the layout and a communicator for each of its groups, as one value.
//
// Megatron keeps its process groups in module globals (parallel_state.get_tensor_model_parallel_group()
// ...); Gale passes a ParallelState (or just the Comm a layer needs) down by value or reference.
// Copies share the communicators. Built once at start-up:
//
//   GALE_ASSIGN_OR_RETURN(RankLayout layout, compute_rank_layout(sizes));
//   ParallelState ps = ParallelState::create(world, layout);   // collective over the world
//   print_rank0(render_rank_layout(layout));
//   ... column_parallel_linear(x, w, ps.tp()); dp_grad_reduce(buckets, ps.dp_cp()); ...
#pragma once

#include <array>

#include "comm/communicator.h"
#include "parallel/dist_train_layout.h"
#include "parallel/rank_grid.h"

namespace gale {

class ParallelState {
 public:
  // One process, every group of size 1 (self communicators).
  ParallelState();

  // Creates every group of `layout` with world->make_group, in the same order on every rank
  // (a collective over `world`). `layout.sizes.world_size` must equal world->size().
  static ParallelState create(const Comm& world, const RankLayout& layout);

  // --dist-train (parallel/dist_train_layout.h; a collective over `world`, the job): the groups of
  // this rank's sub-world grid (TP, DP, ... made over the sub-world's ranks), except
  //   pp()    the whole pipeline across the sub-worlds (DistTrainPipelineComm): coords().pp is the
  //           global stage and pp_size() the number of stages of all sub-worlds;
  //   model() every rank of this main data-parallel replica in every sub-world (the gradient norm's
  //           group; DistTrainModelComm counts each sub-world's replicas once);
  //   embedding() the first and last stages' ranks of this main replica (all their TP ranks and
  //           replicas; null elsewhere), for tied embeddings; position_embedding() null.
  // layout() is the sub-world's grid and world() the job.
  // `hidden` and `micro_batch` (this rank's) cut and join the transfers along the batch between
  // sub-worlds of different data-parallel sizes (DistTrainPipelineComm).
  static ParallelState create_dist_train(const Comm& world, const DistTrainLayout& layout, int64_t hidden,
                                         int64_t micro_batch);

  const RankLayout& layout() const { return *layout_; }
  const RankCoords& coords() const { return coords_; }
  int world_rank() const { return world_->rank(); }
  int world_size() const { return world_->size(); }
  const Comm& world() const { return world_; }

  // The communicator of this rank's group of kind `g`; nullptr for the embedding groups on
  // ranks that hold neither the first nor the last pipeline stage.
  const Comm& group(Group g) const { return groups_[static_cast<int>(g)]; }
  const Comm& tp() const { return group(Group::kTensor); }
  const Comm& pp() const { return group(Group::kPipeline); }
  const Comm& dp() const { return group(Group::kData); }
  const Comm& cp() const { return group(Group::kContext); }
  const Comm& dp_cp() const { return group(Group::kDataContext); }
  const Comm& model() const { return group(Group::kModel); }
  const Comm& embedding() const { return group(Group::kEmbedding); }
  const Comm& position_embedding() const { return group(Group::kPositionEmbedding); }
  const Comm& expert() const { return group(Group::kExpert); }
  const Comm& expert_tp() const { return group(Group::kExpertTensor); }
  const Comm& expert_dp() const { return group(Group::kExpertData); }

  int tp_size() const { return layout_->sizes.tp; }
  int pp_size() const { return pipeline_stages_ > 0 ? pipeline_stages_ : layout_->sizes.pp; }
  int cp_size() const { return layout_->sizes.cp; }
  int dp_size() const { return layout_->dp; }
  bool is_pipeline_first_stage() const { return coords_.pp == 0; }
  bool is_pipeline_last_stage() const { return coords_.pp == pp_size() - 1; }
  // The dist-train rank map (null without --dist-train).
  const std::shared_ptr<const DistTrainLayout>& dist_train() const { return dist_train_; }

  // Sums of the CommStats of every group this rank belongs to (each group counted once).
  CommStats total_stats() const;
  void reset_stats() const;

 private:
  struct Uninitialised {};
  explicit ParallelState(Uninitialised) {}
  std::shared_ptr<const RankLayout> layout_;
  RankCoords coords_;
  Comm world_;
  std::array<Comm, kNumGroups> groups_;
  int pipeline_stages_ = 0;  // --dist-train: the stages of all sub-worlds (0: the layout's PP)
  std::shared_ptr<const DistTrainLayout> dist_train_;
};

}  // namespace gale
