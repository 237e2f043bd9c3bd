// Tagged non-blocking sends and prefetched receives between virtual pipeline stages.
#include "schedule/pipeline_p2p.h"

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>

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
  auto keep = [&](Pending& p) {
    for (Tensor& t : p.tensors) tensors.push_back(std::move(t));
    for (WorkPtr& w : p.works) works.push_back(std::move(w));
  };
  for (auto& [key, p] : recvs_) keep(p);
  for (Pending& p : sends_) keep(p);
  if (!tensors.empty() || !works.empty()) keep_until_exit(std::move(tensors), std::move(works));
}

int PipelineP2P::tag(bool forward, int receiver_stage, int64_t mb, int num_virtual_stages) {
  const int64_t t = (mb * num_virtual_stages + receiver_stage) * 2 + (forward ? 0 : 1);
  return static_cast<int>(t % kTagModulus);
}

void PipelineP2P::post_recv(bool forward, int chunk, int64_t mb, const Shape& shape) {
  post_recv_tensors(forward, chunk, mb, {hidden_states_spec(shape)});
}

void PipelineP2P::post_recv_tensors(bool forward, int chunk, int64_t mb, const PipeTensorSpecs& specs) {
  const Key key{forward, chunk, mb};
  if (recvs_.count(key)) return;
  const int stage = virtual_stage(chunk);
  GALE_CHECK(forward ? !first_virtual_stage(chunk) : !last_virtual_stage(chunk))
      << "virtual stage " << stage << " receives no " << (forward ? "activation" : "gradient");
  GALE_CHECK(!specs.empty()) << "a pipeline transfer holds at least one tensor";
  // Activations come from the previous stage, gradients from the next one.
  const int peer = rank_of(forward ? stage - 1 : stage + 1);
  if (peer == rank_) return;  // handed over by send()
  Pending p;
  for (const PipeTensorSpec& spec : specs) {  // in list order: the sender issues its sends in this order
    Tensor t = Tensor::empty(spec.shape, spec.dtype);
    p.works.push_back(comm(forward).recv_async(t.raw(), t.numel(), spec.dtype, peer,
                                               tag(forward, stage, mb, num_virtual_stages())));
    p.tensors.push_back(std::move(t));
  }
  recvs_.emplace(key, std::move(p));
}

bool PipelineP2P::recv_posted(bool forward, int chunk, int64_t mb) const {
  return recvs_.count(Key{forward, chunk, mb}) > 0;
}

Tensor PipelineP2P::wait_recv(bool forward, int chunk, int64_t mb) {
  std::vector<Tensor> t = wait_recv_tensors(forward, chunk, mb);
  GALE_CHECK_EQ(t.size(), size_t{1}) << "a one-tensor receive of a transfer of several tensors";
  return std::move(t[0]);
}

std::vector<Tensor> PipelineP2P::wait_recv_tensors(bool forward, int chunk, int64_t mb) {
  auto local = local_.find(Key{forward, chunk, mb});
  if (local != local_.end()) {
    std::vector<Tensor> t = std::move(local->second);
    local_.erase(local);
    return t;
  }
  auto it = recvs_.find(Key{forward, chunk, mb});
  GALE_CHECK(it != recvs_.end()) << "no receive posted for " << (forward ? "forward" : "backward") << " of chunk "
                                 << chunk << ", micro-batch " << mb;
  for (WorkPtr& w : it->second.works) w->wait();
  std::vector<Tensor> t = std::move(it->second.tensors);
  recvs_.erase(it);
  return t;
}

void PipelineP2P::send(bool forward, int chunk, int64_t mb, Tensor t) {
  GALE_CHECK(t.defined() && t.dtype() == DType::kF32) << "pipeline transfers are f32 tensors";
  std::vector<Tensor> one;
  one.push_back(std::move(t));
  send_tensors(forward, chunk, mb, std::move(one));
}

void PipelineP2P::send_tensors(bool forward, int chunk, int64_t mb, std::vector<Tensor> tensors) {
  const int stage = virtual_stage(chunk);
  GALE_CHECK(forward ? !last_virtual_stage(chunk) : !first_virtual_stage(chunk))
      << "virtual stage " << stage << " sends no " << (forward ? "activation" : "gradient");
  GALE_CHECK(!tensors.empty()) << "a pipeline transfer holds at least one tensor";
  for (const Tensor& t : tensors) GALE_CHECK(t.defined()) << "an undefined tensor in a pipeline transfer";
  const int receiver = forward ? stage + 1 : stage - 1;
  const int peer = rank_of(receiver);
  if (peer == rank_) {  // the V's turn on the last rank: the receiving chunk is here
    const int receiver_chunk = virtual_stage(0) == receiver ? 0 : 1;
    GALE_CHECK_EQ(virtual_stage(receiver_chunk), receiver);
    local_[Key{forward, receiver_chunk, mb}] = std::move(tensors);
    return;
  }
  Pending p;
  for (Tensor& t : tensors) {
    p.works.push_back(
        comm(forward).send_async(t.raw(), t.numel(), t.dtype(), peer, tag(forward, receiver, mb, num_virtual_stages())));
    p.tensors.push_back(std::move(t));
  }
  sends_.push_back(std::move(p));
}

namespace {
// One line per micro-batch: the descriptions of its transfer's tensors.
std::string describe_transfers(const PipelineP2P::StageSpecsFn& specs, int chunk, int64_t num_microbatches) {
  std::string text;
  for (int64_t m = 0; m < num_microbatches; ++m) text += describe(specs(chunk, m)) + "\n";
  return text;
}
// Line `m` of describe_transfers' text.
std::string line_of(const std::string& text, int64_t m) {
  size_t begin = 0;
  for (int64_t i = 0; i < m && begin != std::string::npos; ++i) {
    begin = text.find('\n', begin);
    if (begin != std::string::npos) ++begin;
  }
  if (begin == std::string::npos || begin >= text.size()) return "nothing";
  return text.substr(begin, text.find('\n', begin) - begin);
}
}  // namespace

Status PipelineP2P::agree_on_tensors(const StageSpecsFn& outputs, const StageSpecsFn& inputs,
                                     int64_t num_microbatches) {
  // Each stage's description of what it sends, to the rank holding the next stage: its length,
  // then its bytes, both with the tag of the next stage's micro-batch-0 forward transfer (no data
  // transfer is in flight, and the agreement below ends the exchange on every rank).
  struct Outgoing {
    int64_t length = 0;
    std::string text;
    std::vector<WorkPtr> works;
  };
  std::vector<std::unique_ptr<Outgoing>> outgoing;  // stable addresses until the sends complete
  std::map<int, std::string> local;                  // receiving chunk -> the text handed over here
  for (int c = 0; c < num_chunks_; ++c) {
    if (last_virtual_stage(c)) continue;
    const int receiver = virtual_stage(c) + 1, peer = rank_of(receiver);
    std::string text = describe_transfers(outputs, c, num_microbatches);
    if (peer == rank_) {
      local[virtual_stage(0) == receiver ? 0 : 1] = std::move(text);
      continue;
    }
    auto o = std::make_unique<Outgoing>();
    o->text = std::move(text);
    o->length = static_cast<int64_t>(o->text.size());
    const int t = tag(true, receiver, 0, num_virtual_stages());
    o->works.push_back(pp_->send_async(&o->length, 1, DType::kI64, peer, t));
    if (o->length > 0) o->works.push_back(pp_->send_async(o->text.data(), o->length, DType::kU8, peer, t));
    outgoing.push_back(std::move(o));
  }
  std::string error;
  for (int c = 0; c < num_chunks_; ++c) {
    if (first_virtual_stage(c)) continue;
    const int stage = virtual_stage(c), peer = rank_of(stage - 1);
    std::string received;
    if (peer == rank_) {
      received = local[c];
    } else {
      const int t = tag(true, stage, 0, num_virtual_stages());
      int64_t length = 0;
      pp_->recv_async(&length, 1, DType::kI64, peer, t)->wait();
      received.resize(static_cast<size_t>(length));
      if (length > 0) pp_->recv_async(received.data(), length, DType::kU8, peer, t)->wait();
    }
    const std::string expected = describe_transfers(inputs, c, num_microbatches);
    if (received == expected || !error.empty()) continue;
    int64_t m = 0;
    while (m < num_microbatches && line_of(received, m) == line_of(expected, m)) ++m;
    error = "pipeline transfer mismatch (--use-multiparameter-pipeline-model-parallel): virtual stage " +
            std::to_string(stage) + " (pipeline rank " + std::to_string(rank_) + ") expects for micro-batch " +
            std::to_string(m) + " [" + line_of(expected, m) + "] from virtual stage " + std::to_string(stage - 1) +
            " (pipeline rank " + std::to_string(peer) + "), which sends [" + line_of(received, m) + "]";
  }
  for (auto& o : outgoing)
    for (WorkPtr& w : o->works) w->wait();
  const int64_t failed = pp_->all_reduce_scalar(error.empty() ? int64_t{0} : int64_t{rank_} + 1, ReduceOp::kMax);
  if (!error.empty()) return InvalidArgument(error);
  if (failed > 0)
    return FailedPrecondition("pipeline rank ", failed - 1, " found that the tensors its previous stage sends are not ",
                              "the ones it expects (its error names them)");
  return Status::Ok();
}

void PipelineP2P::release_completed() {
  auto done = [](Pending& p) {
    for (WorkPtr& w : p.works)
      if (!w->test()) return false;
    return true;
  };
  sends_.erase(std::remove_if(sends_.begin(), sends_.end(), done), sends_.end());
}

void PipelineP2P::finish() {
  for (Pending& p : sends_)
    for (WorkPtr& w : p.works) w->wait();
  sends_.clear();
}

}  // namespace gale
