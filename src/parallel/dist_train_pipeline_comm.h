// The pipeline group of a dist-train job: one communicator whose ranks are the global stages.
//
// Its ranks are the pipeline stages of one data-parallel replica across all sub-worlds
// (parallel/dist_train_layout.h).
// ParallelState::pp() is this communicator under --dist-train, so the schedules, PipelineP2P and
// the trainer's loss reductions run unchanged: rank() is this rank's global stage and size() the
// number of stages. Underneath, every operation goes over `transport`, a real communicator over
// DistTrainLayout::pipeline_ranks(dp) (several ranks per stage when TP > 1):
//   - send_async(dst = adjacent stage): one message to each rank of that stage that takes its input
//     from this rank (DistTrainLayout::targets_of; none when another TP rank is its source), the
//     target's slice of the tensor along the batch when the target's sub-world has more replicas;
//   - recv_async(src = adjacent stage): from this rank's sources in that stage (sources_of), the
//     pieces put in place along the batch when they are several (the sender's sub-world has more
//     replicas);
// The batch dimension: a tensor is [S·B, H] with row s·B + b (B this rank's micro-batch size, H
// `row_elems` elements per row), so slice r of q is rows s·B + r·B/q + [0, B/q) of every s; with
// sequence parallelism across TP sizes that differ the slices are the q row blocks instead.
//   - all_reduce_async: kMax / kMin over every rank; kSum with the ranks of tp coordinate > 0
//     contributing zeros, so every stage counts once (the pipeline's sums — loss, MoE and MTP
//     losses, load flags — are the same on every TP rank of a stage);
//   - broadcast_async(root = stage): from the stage's rank of tp coordinate 0.
// Other collectives and make_group are not used on a pipeline group and abort.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "parallel/dist_train_layout.h"

namespace gale {

class DistTrainPipelineComm : public Communicator {
 public:
  // `transport` holds DistTrainLayout::pipeline_ranks of this rank's main data-parallel replica, in
  // that order; `world_rank` is this rank in the job; `row_elems` (the hidden size) and
  // `micro_batch` (this rank's micro-batch size) place slices along the batch.
  DistTrainPipelineComm(Comm transport, std::shared_ptr<const DistTrainLayout> layout, int world_rank,
                        int64_t row_elems, int64_t micro_batch);

  int rank() const override { return stage_; }
  int size() const override { return layout_->num_stages(); }
  const std::vector<int>& world_ranks() const override { return transport_->world_ranks(); }
  const std::string& name() const override { return name_; }
  const char* backend() const override { return transport_->backend(); }

  WorkPtr all_reduce_async(void* buf, int64_t count, DType dtype, ReduceOp op) override;
  WorkPtr broadcast_async(void* buf, int64_t count, DType dtype, int root) override;
  WorkPtr send_async(const void* buf, int64_t count, DType dtype, int dst, int tag) override;
  WorkPtr recv_async(void* buf, int64_t count, DType dtype, int src, int tag) override;
  void barrier() override { transport_->barrier(); }

  WorkPtr reduce_scatter_async(const void*, void*, int64_t, DType, ReduceOp) override;
  WorkPtr all_gather_async(const void*, void*, int64_t, DType) override;
  WorkPtr all_to_all_async(const void*, void*, int64_t, DType) override;
  WorkPtr all_to_allv_async(const void*, const std::vector<int64_t>&, const std::vector<int64_t>&, void*,
                            const std::vector<int64_t>&, const std::vector<int64_t>&, DType) override;
  Comm make_group(const std::vector<int>&, const std::string&) override;

 private:
  int index_of(int world_rank) const;  // the transport's rank of a job rank
  Comm transport_;
  std::shared_ptr<const DistTrainLayout> layout_;
  int world_rank_, stage_;
  int64_t row_elems_, micro_batch_;
  std::string name_ = "pp";
  std::map<int, int> index_;
};

// The model-parallel group of a dist-train job (ParallelState::model(): every rank of a main
// data-parallel replica in every sub-world), for the optimizer's norms: kSum counts each
// sub-world's replicas once (only DistTrainLayout::first_replica ranks contribute; the replicas
// hold the same data-parallel-reduced gradients), kMax / kMin go over every rank. Other operations
// are not used on it and abort.
class DistTrainModelComm : public Communicator {
 public:
  DistTrainModelComm(Comm group, bool contributes) : group_(std::move(group)), contributes_(contributes) {}
  int rank() const override { return group_->rank(); }
  int size() const override { return group_->size(); }
  const std::vector<int>& world_ranks() const override { return group_->world_ranks(); }
  const std::string& name() const override { return group_->name(); }
  const char* backend() const override { return group_->backend(); }
  WorkPtr all_reduce_async(void* buf, int64_t n, DType dtype, ReduceOp op) override;
  WorkPtr broadcast_async(void*, int64_t, DType, int) override;
  WorkPtr send_async(const void*, int64_t, DType, int, int) override;
  WorkPtr recv_async(void*, int64_t, DType, int, int) override;
  void barrier() override { group_->barrier(); }
  WorkPtr reduce_scatter_async(const void*, void*, int64_t, DType, ReduceOp) override;
  WorkPtr all_gather_async(const void*, void*, int64_t, DType) override;
  WorkPtr all_to_all_async(const void*, void*, int64_t, DType) override;
  WorkPtr all_to_allv_async(const void*, const std::vector<int64_t>&, const std::vector<int64_t>&, void*,
                            const std::vector<int64_t>&, const std::vector<int64_t>&, DType) override;
  Comm make_group(const std::vector<int>&, const std::string&) override;

 private:
  Comm group_;
  bool contributes_;
};

}  // namespace gale
