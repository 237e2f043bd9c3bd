// The no-pipelining schedule.
#include "schedule/schedules.h"

namespace gale {

StatusOr<ForwardBackwardResult> forward_backward_no_pipelining(GPTModel& model, int64_t num_microbatches,
                                                               const MicroBatchSource& source, bool forward_only) {
  ForwardBackwardResult r;
  MicroBatch mb;
  for (int64_t m = 0; m < num_microbatches; ++m) {
    GALE_RETURN_IF_ERROR(source(m, &mb));
    GPTModel::LossSums sums;
    model.forward(m, mb, Tensor(), /*training=*/!forward_only, &sums);
    r.loss_sum += sums.loss_sum;
    r.tokens += sums.tokens;
    if (!forward_only) model.backward(m, Tensor(), micro_batch_loss_scale(sums.tokens, num_microbatches));
  }
  return r;
}

StatusOr<ForwardBackwardResult> forward_backward(const std::vector<GPTModel*>& chunks, const ParallelState& ps,
                                                 int64_t num_microbatches, const MicroBatchSource& source,
                                                 bool forward_only) {
  if (ps.pp_size() == 1 && chunks.size() == 1)
    return forward_backward_no_pipelining(*chunks[0], num_microbatches, source, forward_only);
  return Unimplemented("pipeline parallelism is not supported yet");
}

}  // namespace gale
