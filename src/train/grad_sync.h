// Megatron's finalize_model_grads: after the backward of every micro-batch, make each rank's
// gradients the ones its optimizer step needs.
//   1. sequence parallelism: gradients of parameters replicated across TP but fed by a split
//      sequence (norm weights, row-parallel biases) are partial per TP rank: all-reduce over TP;
//   2. tied embedding and output weights on different pipeline stages: all-reduce over the
//      embedding group (first and last stage);
//   3. data parallelism: average over the data-parallel (x context-parallel) group.
#pragma once

#include <vector>

#include "model/gpt_model.h"
#include "parallel/parallel_state.h"

namespace gale {

void finalize_model_grads(const ParallelState& ps, const std::vector<GPTModel*>& chunks);

}  // namespace gale
