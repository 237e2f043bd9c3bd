// Forward/backward over the micro-batches of one iteration (pipeline schedules live here).
//
// Megatron's loss contract: micro-batch m contributes loss_m = Σ ℓ·mask / Σ mask, and the
// differentiated objective is Σ_m loss_m / num_microbatches; so backward of micro-batch m starts
// from loss_scale = 1 / (Σ mask_m · num_microbatches). The reported loss sums Σ ℓ·mask and Σ mask
// over all micro-batches (the caller divides).
#pragma once

#include <cstdint>
#include <functional>

#include "core/status.h"
#include "model/gpt_model.h"
#include "parallel/parallel_state.h"

namespace gale {

// Fills `mb` with micro-batch m of the current iteration.
using MicroBatchSource = std::function<Status(int64_t m, MicroBatch* mb)>;

struct ForwardBackwardResult {
  double loss_sum = 0.0;  // Σ ℓ·mask over this rank's micro-batches (last pipeline stage)
  double tokens = 0.0;    // Σ mask
};

// No pipeline: forward then backward of each micro-batch in turn (forward only when
// `forward_only`, e.g. evaluation).
StatusOr<ForwardBackwardResult> forward_backward_no_pipelining(GPTModel& model, int64_t num_microbatches,
                                                               const MicroBatchSource& source, bool forward_only);

// Dispatches to the schedule the layout needs: no pipelining (one chunk, PP = 1), 1F1B (PP > 1),
// or interleaved 1F1B (several chunks per rank). `chunks` are this rank's virtual stages in order.
StatusOr<ForwardBackwardResult> forward_backward(const std::vector<GPTModel*>& chunks, const ParallelState& ps,
                                                 int64_t num_microbatches, const MicroBatchSource& source,
                                                 bool forward_only);

// The gradient scale of a micro-batch with `tokens` loss tokens (0 when it has none: Megatron
// would divide by zero; Gale lets such a micro-batch contribute nothing).
inline float micro_batch_loss_scale(double tokens, int64_t num_microbatches) {
  return tokens > 0.0 ? static_cast<float>(1.0 / (tokens * static_cast<double>(num_microbatches))) : 0.0f;
}

}  // namespace gale
