// The queue of deferred linear weight gradients.
#include "model/weight_grad_store.h"

#include "core/check.h"
#include "model/expert_loop.h"

namespace gale {

WeightGradStore::Record WeightGradStore::make_record(const Tensor& dy, const Tensor& x, const LinearWeight& w) {
  Record r{to_gemm_input(dy, x.dtype()), x, w};  // dy kept in the GEMM's type (half the bytes under --bf16)
  r.w.defer = nullptr;
  // dW needs only the gradient: drop the weight's values, and --qat-scheme's fake-quantised copy
  // with them (not held until the W step).
  r.w.w = nullptr;
  r.w.w_bf16 = nullptr;
  r.w.w_f16 = nullptr;
  r.w.qat_w = Tensor();
  r.w.qat_w_bf16 = Tensor();
  return r;
}

int64_t WeightGradStore::release(Record& r) {
  const int64_t bytes = r.x.defined() ? static_cast<int64_t>(r.dy.nbytes() + r.x.nbytes()) : 0;
  r = Record();
  return bytes;
}

void WeightGradStore::put(const Tensor& dy, const Tensor& x, const LinearWeight& w) {
  GALE_CHECK(!in_experts_) << "a single weight gradient queued inside an expert batch";
  Entry entry;
  entry.records.push_back(make_record(dy, x, w));
  held_bytes_ += static_cast<int64_t>(entry.records[0].dy.nbytes() + entry.records[0].x.nbytes());
  open_.push_back(std::move(entry));
}

void WeightGradStore::begin_experts(int64_t E) {
  GALE_CHECK(!in_experts_) << "expert batches do not nest";
  in_experts_ = true;
  experts_ = Entry{std::vector<Record>(static_cast<size_t>(E)), true};
}

void WeightGradStore::put_expert(int64_t e, const Tensor& dy, const Tensor& x, const LinearWeight& w) {
  GALE_CHECK(in_experts_ && e >= 0 && e < static_cast<int64_t>(experts_.records.size())) << "expert " << e;
  GALE_CHECK(!experts_.records[e].x.defined()) << "expert " << e << " queued twice in one batch";
  experts_.records[e] = make_record(dy, x, w);
}

void WeightGradStore::end_experts() {
  GALE_CHECK(in_experts_) << "end_experts without begin_experts";
  in_experts_ = false;
  for (const Record& r : experts_.records)
    if (r.x.defined()) held_bytes_ += static_cast<int64_t>(r.dy.nbytes() + r.x.nbytes());
  open_.push_back(std::move(experts_));
  experts_ = Entry();
}

void WeightGradStore::flush(int chunk, int64_t microbatch) {
  GALE_CHECK(!in_experts_) << "a backward step ended inside an expert batch";
  groups_.push_back(Group{chunk, microbatch, std::move(open_)});
  open_.clear();
}

std::pair<int, int64_t> WeightGradStore::pop() {
  GALE_CHECK(!groups_.empty()) << "a weight-gradient step with no deferred backward";
  Group g = std::move(groups_.front());
  groups_.pop_front();
  for (Entry& entry : g.entries) {
    if (!entry.experts) {
      linear_backward_weight(entry.records[0].dy, entry.records[0].x, entry.records[0].w);
      held_bytes_ -= release(entry.records[0]);  // release the tensors as soon as they are used
      continue;
    }
    std::vector<Record>& rec = entry.records;
    for_each_expert(static_cast<int64_t>(rec.size()), [&](int64_t e) {
      if (rec[e].x.defined()) linear_backward_weight(rec[e].dy, rec[e].x, rec[e].w);
    });
    for (Record& r : rec) held_bytes_ -= release(r);
  }
  return {g.chunk, g.microbatch};
}

}  // namespace gale
