// The dist-train pipeline communicator: stage-numbered p2p and reductions over the sub-worlds.
#include "parallel/dist_train_pipeline_comm.h"

#include <cstring>

#include "core/check.h"

namespace gale {

namespace {

// Several transfers as one handle.
class AllWork : public Work {
 public:
  explicit AllWork(std::vector<WorkPtr> works) : works_(std::move(works)) {}
  void wait() override {
    for (const WorkPtr& w : works_) w->wait();
  }
  bool test() override {
    bool done = true;
    for (const WorkPtr& w : works_) done = w->test() && done;
    return done;
  }

 private:
  std::vector<WorkPtr> works_;
};

}  // namespace

DistTrainPipelineComm::DistTrainPipelineComm(Comm transport, std::shared_ptr<const DistTrainLayout> layout,
                                             int world_rank)
    : transport_(std::move(transport)), layout_(std::move(layout)), world_rank_(world_rank) {
  stage_ = layout_->stage_of(world_rank_);
  const std::vector<int>& members = transport_->world_ranks();
  GALE_CHECK(members == layout_->pipeline_ranks(layout_->dp_of(world_rank_)))
      << "the dist-train pipeline transport holds other ranks than the pipeline of rank " << world_rank_;
  for (size_t i = 0; i < members.size(); ++i) index_[members[i]] = static_cast<int>(i);
}

int DistTrainPipelineComm::index_of(int world_rank) const {
  auto it = index_.find(world_rank);
  GALE_CHECK(it != index_.end()) << "rank " << world_rank << " is not in this dist-train pipeline";
  return it->second;
}

WorkPtr DistTrainPipelineComm::all_reduce_async(void* buf, int64_t n, DType dtype, ReduceOp op) {
  count(CommOp::kAllReduce, n * dtype_size(dtype));
  if (op == ReduceOp::kSum && layout_->tp_of(world_rank_) != 0)
    std::memset(buf, 0, static_cast<size_t>(n * dtype_size(dtype)));  // one contribution per stage
  return transport_->all_reduce_async(buf, n, dtype, op);
}

WorkPtr DistTrainPipelineComm::broadcast_async(void* buf, int64_t n, DType dtype, int root) {
  count(CommOp::kBroadcast, n * dtype_size(dtype));
  const int s = layout_->subworld_of_stage(root);
  const int from = layout_->rank_at(s, 0, layout_->dp_of(world_rank_), root - layout_->subworlds[s].first_stage);
  return transport_->broadcast_async(buf, n, dtype, index_of(from));
}

WorkPtr DistTrainPipelineComm::send_async(const void* buf, int64_t n, DType dtype, int dst, int tag) {
  std::vector<WorkPtr> works;
  for (int r : layout_->targets_of(world_rank_, dst)) {
    count(CommOp::kSend, n * dtype_size(dtype));
    works.push_back(transport_->send_async(buf, n, dtype, index_of(r), tag));
  }
  if (works.empty()) return completed_work();
  if (works.size() == 1) return works.front();
  return std::make_shared<AllWork>(std::move(works));
}

WorkPtr DistTrainPipelineComm::recv_async(void* buf, int64_t n, DType dtype, int src, int tag) {
  count(CommOp::kRecv, n * dtype_size(dtype));
  return transport_->recv_async(buf, n, dtype, index_of(layout_->source_of(world_rank_, src)), tag);
}

WorkPtr DistTrainPipelineComm::reduce_scatter_async(const void*, void*, int64_t, DType, ReduceOp) {
  GALE_CHECK(false) << "reduce_scatter on the dist-train pipeline group";
  return nullptr;
}
WorkPtr DistTrainPipelineComm::all_gather_async(const void*, void*, int64_t, DType) {
  GALE_CHECK(false) << "all_gather on the dist-train pipeline group";
  return nullptr;
}
WorkPtr DistTrainPipelineComm::all_to_all_async(const void*, void*, int64_t, DType) {
  GALE_CHECK(false) << "all_to_all on the dist-train pipeline group";
  return nullptr;
}
WorkPtr DistTrainPipelineComm::all_to_allv_async(const void*, const std::vector<int64_t>&,
                                                 const std::vector<int64_t>&, void*, const std::vector<int64_t>&,
                                                 const std::vector<int64_t>&, DType) {
  GALE_CHECK(false) << "all_to_allv on the dist-train pipeline group";
  return nullptr;
}
Comm DistTrainPipelineComm::make_group(const std::vector<int>&, const std::string&) {
  GALE_CHECK(false) << "make_group on the dist-train pipeline group (--optimize-send-recv-comm is refused with "
                       "--dist-train)";
  return nullptr;
}

}  // namespace gale
