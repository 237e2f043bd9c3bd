// The queue of deferred linear weight gradients.
#include "model/weight_grad_store.h"

#include "core/check.h"

namespace gale {

void WeightGradStore::put(const Tensor& dy, const Tensor& x, const LinearWeight& w) {
  Record r{to_gemm_input(dy, x.dtype()), x, w};  // dy kept in the GEMM's type (half the bytes under --bf16)
  r.w.defer = nullptr;
  held_bytes_ += static_cast<int64_t>(r.dy.nbytes() + r.x.nbytes());
  open_.push_back(std::move(r));
}

void WeightGradStore::flush(int chunk, int64_t microbatch) {
  groups_.push_back(Group{chunk, microbatch, std::move(open_)});
  open_.clear();
}

std::pair<int, int64_t> WeightGradStore::pop() {
  GALE_CHECK(!groups_.empty()) << "a weight-gradient step with no deferred backward";
  Group g = std::move(groups_.front());
  groups_.pop_front();
  for (Record& r : g.records) {
    linear_backward_weight(r.dy, r.x, r.w);
    held_bytes_ -= static_cast<int64_t>(r.dy.nbytes() + r.x.nbytes());
    r = Record();  // release the tensors as soon as they are used
  }
  return {g.chunk, g.microbatch};
}

}  // namespace gale
