// The dist-train pipeline communicator: stage-numbered p2p and reductions over the sub-worlds.
#include "parallel/dist_train_pipeline_comm.h"

#include <cstring>
#include <functional>
#include <utility>

#include "core/check.h"

namespace gale {

namespace {

// Several transfers as one handle; `on_complete` runs once, when all have completed (the pieces of
// a gathered receive are put in place then), and `keep` stays alive until then.
class AllWork : public Work {
 public:
  AllWork(std::vector<WorkPtr> works, std::function<void()> on_complete = {}, std::shared_ptr<void> keep = {})
      : works_(std::move(works)), on_complete_(std::move(on_complete)), keep_(std::move(keep)) {}
  void wait() override {
    for (const WorkPtr& w : works_) w->wait();
    complete();
  }
  bool test() override {
    bool done = true;
    for (const WorkPtr& w : works_) done = w->test() && done;
    if (done) complete();
    return done;
  }

 private:
  void complete() {
    if (on_complete_) std::exchange(on_complete_, {})();
    keep_.reset();
  }
  std::vector<WorkPtr> works_;
  std::function<void()> on_complete_;
  std::shared_ptr<void> keep_;
};

// Copies slice r of q between a whole tensor and a slice buffer: along the sequence the r-th of q
// equal blocks; along the batch rows s·B + r·B/q + [0, B/q) of `whole` <-> rows s·B/q + [0, B/q)
// of `part`.
void copy_slice(char* whole, char* part, int64_t bytes, int64_t row_bytes, int64_t B, int r, int q, bool to_part,
                bool sequence) {
  if (sequence) {
    GALE_CHECK(bytes % (q * row_bytes) == 0) << "a sequence slice of part of a row";
    char* w = whole + r * (bytes / q);
    if (to_part) std::memcpy(part, w, static_cast<size_t>(bytes / q));
    else std::memcpy(w, part, static_cast<size_t>(bytes / q));
    return;
  }
  GALE_CHECK(B % q == 0) << "micro-batch of " << B << " cut into " << q << " slices";
  const int64_t b = B / q, rows = bytes / row_bytes, S = rows / B;
  GALE_CHECK_EQ(S * B * row_bytes, bytes) << "a transfer that is not [S·B, H]";
  for (int64_t s = 0; s < S; ++s) {
    char* w = whole + (s * B + r * b) * row_bytes;
    char* p = part + s * b * row_bytes;
    if (to_part) std::memcpy(p, w, static_cast<size_t>(b * row_bytes));
    else std::memcpy(w, p, static_cast<size_t>(b * row_bytes));
  }
}

}  // namespace

DistTrainPipelineComm::DistTrainPipelineComm(Comm transport, std::shared_ptr<const DistTrainLayout> layout,
                                             int world_rank, int64_t row_elems, int64_t micro_batch)
    : transport_(std::move(transport)),
      layout_(std::move(layout)),
      world_rank_(world_rank),
      row_elems_(row_elems),
      micro_batch_(micro_batch) {
  stage_ = layout_->stage_of(world_rank_);
  const std::vector<int>& members = transport_->world_ranks();
  GALE_CHECK(members == layout_->pipeline_ranks(layout_->main_dp_of(world_rank_)))
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
  if (op == ReduceOp::kSum && (layout_->tp_of(world_rank_) != 0 || !layout_->first_replica(world_rank_)))
    std::memset(buf, 0, static_cast<size_t>(n * dtype_size(dtype)));  // one contribution per stage
  return transport_->all_reduce_async(buf, n, dtype, op);
}

WorkPtr DistTrainPipelineComm::broadcast_async(void* buf, int64_t n, DType dtype, int root) {
  count(CommOp::kBroadcast, n * dtype_size(dtype));
  const int s = layout_->subworld_of_stage(root);
  const int dp = layout_->main_dp_of(world_rank_) * layout_->dp_ratio(s);
  const int from = layout_->rank_at(s, 0, dp, root - layout_->subworlds[s].first_stage);
  return transport_->broadcast_async(buf, n, dtype, index_of(from));
}

WorkPtr DistTrainPipelineComm::send_async(const void* buf, int64_t n, DType dtype, int dst, int tag) {
  std::vector<WorkPtr> works;
  std::vector<std::shared_ptr<std::vector<char>>> slices;
  for (const DistTrainLayout::Peer& p : layout_->targets_of(world_rank_, dst)) {
    const int64_t elems = n / p.slices;
    count(CommOp::kSend, elems * dtype_size(dtype));
    if (p.slices == 1) {
      works.push_back(transport_->send_async(buf, n, dtype, index_of(p.rank), tag));
      continue;
    }
    auto part = std::make_shared<std::vector<char>>(static_cast<size_t>(elems * dtype_size(dtype)));
    copy_slice(static_cast<char*>(const_cast<void*>(buf)), part->data(), n * dtype_size(dtype),
               row_elems_ * dtype_size(dtype), micro_batch_, p.slice, p.slices, /*to_part=*/true, p.sequence);
    works.push_back(transport_->send_async(part->data(), elems, dtype, index_of(p.rank), tag));
    slices.push_back(std::move(part));
  }
  if (works.empty()) return completed_work();
  if (works.size() == 1 && slices.empty()) return works.front();
  return std::make_shared<AllWork>(std::move(works), std::function<void()>{},
                                   std::make_shared<decltype(slices)>(std::move(slices)));
}

WorkPtr DistTrainPipelineComm::recv_async(void* buf, int64_t n, DType dtype, int src, int tag) {
  const std::vector<DistTrainLayout::Peer> sources = layout_->sources_of(world_rank_, src);
  if (sources.size() == 1) {
    count(CommOp::kRecv, n * dtype_size(dtype));
    return transport_->recv_async(buf, n, dtype, index_of(sources.front().rank), tag);
  }
  // Pieces along the batch from several replicas: received apart, put in place once all arrived.
  const int64_t elems = n / static_cast<int64_t>(sources.size());
  auto parts = std::make_shared<std::vector<std::vector<char>>>();
  std::vector<WorkPtr> works;
  for (const DistTrainLayout::Peer& p : sources) {
    count(CommOp::kRecv, elems * dtype_size(dtype));
    parts->emplace_back(static_cast<size_t>(elems * dtype_size(dtype)));
    works.push_back(transport_->recv_async(parts->back().data(), elems, dtype, index_of(p.rank), tag));
  }
  const int64_t bytes = n * dtype_size(dtype), row_bytes = row_elems_ * dtype_size(dtype), B = micro_batch_;
  auto place = [parts, sources, buf, bytes, row_bytes, B] {
    for (size_t i = 0; i < sources.size(); ++i)
      copy_slice(static_cast<char*>(buf), (*parts)[i].data(), bytes, row_bytes, B, sources[i].slice,
                 sources[i].slices, /*to_part=*/false, sources[i].sequence);
  };
  return std::make_shared<AllWork>(std::move(works), std::move(place));
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

WorkPtr DistTrainModelComm::all_reduce_async(void* buf, int64_t n, DType dtype, ReduceOp op) {
  count(CommOp::kAllReduce, n * dtype_size(dtype));
  if (op == ReduceOp::kSum && !contributes_) std::memset(buf, 0, static_cast<size_t>(n * dtype_size(dtype)));
  return group_->all_reduce_async(buf, n, dtype, op);
}
WorkPtr DistTrainModelComm::broadcast_async(void*, int64_t, DType, int) {
  GALE_CHECK(false) << "broadcast on the dist-train model group";
  return nullptr;
}
WorkPtr DistTrainModelComm::send_async(const void*, int64_t, DType, int, int) {
  GALE_CHECK(false) << "send on the dist-train model group";
  return nullptr;
}
WorkPtr DistTrainModelComm::recv_async(void*, int64_t, DType, int, int) {
  GALE_CHECK(false) << "recv on the dist-train model group";
  return nullptr;
}
WorkPtr DistTrainModelComm::reduce_scatter_async(const void*, void*, int64_t, DType, ReduceOp) {
  GALE_CHECK(false) << "reduce_scatter on the dist-train model group";
  return nullptr;
}
WorkPtr DistTrainModelComm::all_gather_async(const void*, void*, int64_t, DType) {
  GALE_CHECK(false) << "all_gather on the dist-train model group";
  return nullptr;
}
WorkPtr DistTrainModelComm::all_to_all_async(const void*, void*, int64_t, DType) {
  GALE_CHECK(false) << "all_to_all on the dist-train model group";
  return nullptr;
}
WorkPtr DistTrainModelComm::all_to_allv_async(const void*, const std::vector<int64_t>&, const std::vector<int64_t>&,
                                              void*, const std::vector<int64_t>&, const std::vector<int64_t>&, DType) {
  GALE_CHECK(false) << "all_to_allv on the dist-train model group";
  return nullptr;
}
Comm DistTrainModelComm::make_group(const std::vector<int>&, const std::string&) {
  GALE_CHECK(false) << "make_group on the dist-train model group";
  return nullptr;
}

}  // namespace gale
