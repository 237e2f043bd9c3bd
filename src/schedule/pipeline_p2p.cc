// Tagged non-blocking sends and prefetched receives between virtual pipeline stages.
#include "schedule/pipeline_p2p.h"

#include <algorithm>
#include <mutex>

#include "core/check.h"

namespace gale {

namespace {
constexpr int kTagModulus = 32768;

// Buffers of transfers abandoned by an early error return: MPI may still read or write them.
void keep_until_exit(std::vector<Tensor> tensors, std::vector<WorkPtr> works) {
  static std::mutex mu;
  static auto* kept = new std::vector<std::pair<Tensor, WorkPtr>>();  // intentionally never freed
  std::lock_guard<std::mutex> lock(mu);
  for (size_t i = 0; i < tensors.size(); ++i) kept->emplace_back(std::move(tensors[i]), std::move(works[i]));
}
}  // namespace

PipelineP2P::PipelineP2P(Comm pp, int num_chunks, StagePlacement placement, Comm backward_group)
    : pp_(std::move(pp)),
      backward_(std::move(backward_group)),
      rank_(pp_->rank()),
      size_(pp_->size()),
      num_chunks_(num_chunks),
      placement_(placement) {
  GALE_CHECK_GE(num_chunks_, 1);
  GALE_CHECK(!backward_ || backward_->world_ranks() == pp_->world_ranks())
      << "the backward pipeline group '" << backward_->name() << "' must hold the pipeline group's ranks in order";
  GALE_CHECK(placement_ == StagePlacement::kLoop || num_chunks_ == 2) << "the V placement has two chunks per rank";
}

int PipelineP2P::stage_of(int rank, int chunk) const {
  if (placement_ == StagePlacement::kV) return chunk == 0 ? rank : 2 * size_ - 1 - rank;
  return chunk * size_ + rank;
}

int PipelineP2P::rank_of(int stage) const {
  if (placement_ == StagePlacement::kV) return stage < size_ ? stage : 2 * size_ - 1 - stage;
  return stage % size_;
}

PipelineP2P::~PipelineP2P() {
  release_completed();
  std::vector<Tensor> tensors;
  std::vector<WorkPtr> works;
  for (auto& [key, p] : recvs_) {
    tensors.push_back(std::move(p.tensor));
    works.push_back(std::move(p.work));
  }
  for (Pending& p : sends_) {
    tensors.push_back(std::move(p.tensor));
    works.push_back(std::move(p.work));
  }
  if (!tensors.empty()) keep_until_exit(std::move(tensors), std::move(works));
}

int PipelineP2P::tag(bool forward, int receiver_stage, int64_t mb, int num_virtual_stages) {
  const int64_t t = (mb * num_virtual_stages + receiver_stage) * 2 + (forward ? 0 : 1);
  return static_cast<int>(t % kTagModulus);
}

void PipelineP2P::post_recv(bool forward, int chunk, int64_t mb, const Shape& shape) {
  const Key key{forward, chunk, mb};
  if (recvs_.count(key)) return;
  const int stage = virtual_stage(chunk);
  GALE_CHECK(forward ? !first_virtual_stage(chunk) : !last_virtual_stage(chunk))
      << "virtual stage " << stage << " receives no " << (forward ? "activation" : "gradient");
  // Activations come from the previous stage, gradients from the next one.
  const int peer = rank_of(forward ? stage - 1 : stage + 1);
  if (peer == rank_) return;  // handed over by send()
  Pending p;
  p.tensor = Tensor::empty(shape);
  p.work = comm(forward).recv_async(p.tensor.raw(), p.tensor.numel(), DType::kF32, peer,
                           tag(forward, stage, mb, num_virtual_stages()));
  recvs_.emplace(key, std::move(p));
}

bool PipelineP2P::recv_posted(bool forward, int chunk, int64_t mb) const {
  return recvs_.count(Key{forward, chunk, mb}) > 0;
}

Tensor PipelineP2P::wait_recv(bool forward, int chunk, int64_t mb) {
  auto local = local_.find(Key{forward, chunk, mb});
  if (local != local_.end()) {
    Tensor t = std::move(local->second);
    local_.erase(local);
    return t;
  }
  auto it = recvs_.find(Key{forward, chunk, mb});
  GALE_CHECK(it != recvs_.end()) << "no receive posted for " << (forward ? "forward" : "backward") << " of chunk "
                                 << chunk << ", micro-batch " << mb;
  it->second.work->wait();
  Tensor t = std::move(it->second.tensor);
  recvs_.erase(it);
  return t;
}

void PipelineP2P::send(bool forward, int chunk, int64_t mb, Tensor t) {
  const int stage = virtual_stage(chunk);
  GALE_CHECK(forward ? !last_virtual_stage(chunk) : !first_virtual_stage(chunk))
      << "virtual stage " << stage << " sends no " << (forward ? "activation" : "gradient");
  GALE_CHECK(t.defined() && t.dtype() == DType::kF32) << "pipeline transfers are f32 tensors";
  const int receiver = forward ? stage + 1 : stage - 1;
  const int peer = rank_of(receiver);
  if (peer == rank_) {  // the V's turn on the last rank: the receiving chunk is here
    const int receiver_chunk = virtual_stage(0) == receiver ? 0 : 1;
    GALE_CHECK_EQ(virtual_stage(receiver_chunk), receiver);
    local_[Key{forward, receiver_chunk, mb}] = std::move(t);
    return;
  }
  Pending p;
  p.work = comm(forward).send_async(t.raw(), t.numel(), DType::kF32, peer, tag(forward, receiver, mb, num_virtual_stages()));
  p.tensor = std::move(t);
  sends_.push_back(std::move(p));
}

void PipelineP2P::release_completed() {
  sends_.erase(std::remove_if(sends_.begin(), sends_.end(), [](Pending& p) { return p.work->test(); }), sends_.end());
}

void PipelineP2P::finish() {
  for (Pending& p : sends_) p.work->wait();
  sends_.clear();
}

}  // namespace gale
