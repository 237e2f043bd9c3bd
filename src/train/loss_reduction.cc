// Blocking or non-blocking reduction of the logged lm loss.
#include "train/loss_reduction.h"

#include "core/check.h"

namespace gale {

LossReduction LossReduction::start(Communicator* dp, double loss_sum, double tokens, bool async) {
  LossReduction r;
  r.sums_ = std::make_unique<std::array<double, 2>>(std::array<double, 2>{loss_sum, tokens});
  if (dp && dp->size() > 1) {
    if (async)
      r.work_ = dp->all_reduce_async(r.sums_->data(), 2, DType::kF64, ReduceOp::kSum);
    else
      dp->all_reduce(r.sums_->data(), 2, DType::kF64, ReduceOp::kSum);
  }
  return r;
}

LossReduction::~LossReduction() {
  if (work_) work_->wait();
}

void LossReduction::finish(Communicator* pp, int root) {
  GALE_CHECK(sums_ && !finished_) << "LossReduction::finish without start, or twice";
  if (work_) work_->wait();
  work_ = nullptr;
  if (pp && pp->size() > 1) pp->broadcast(sums_->data(), 2, DType::kF64, root < 0 ? pp->size() - 1 : root);
  finished_ = true;
}

double LossReduction::loss_sum() const {
  GALE_CHECK(finished_) << "the logged loss read before LossReduction::finish";
  return (*sums_)[0];
}

double LossReduction::tokens() const {
  GALE_CHECK(finished_) << "the logged loss read before LossReduction::finish";
  return (*sums_)[1];
}

}  // namespace gale
