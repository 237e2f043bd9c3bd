// What Gale's pipeline stages hand each other under --use-multiparameter-pipeline-model-parallel.
//
// The plain pipeline sends one tensor, the hidden states [Tl, H], and every stage reads the rest of
// what its layers need from its own copy of the micro-batch. With the flag a stage's output is a
// list of typed tensors (pipeline_tensor_spec.h), in this order:
//   hidden_states  f32 [Tl, H]  (with a gradient, which travels back as in the plain pipeline)
//   document_ids   i32 [B, S]   (with --reset-attention-mask; no gradient)
// The first stage takes the document ids from its micro-batch; every later stage takes them from
// the transfer (into its micro-batch, before its forward) and passes them on, so only the first
// pipeline rank needs them from the data (Trainer::load_micro_batch leaves them out elsewhere)
// and every stage's attention masks come from the ids the embedding stage saw.
#pragma once

#include <vector>

#include "core/tensor.h"
#include "model/micro_batch.h"
#include "schedule/pipeline_tensor_spec.h"

namespace gale {

struct StageTensors {
  // --reset-attention-mask: the document ids travel with the hidden states.
  bool document_ids = false;

  // The list for micro-batch `mb` whose hidden states have shape `hidden` (the forward transfer;
  // gradient_specs of it is the backward one).
  PipeTensorSpecs specs(const Shape& hidden, const MicroBatch& mb) const;
  // What a stage sends: its output `hidden` and the ids of `mb` (which must hold them).
  std::vector<Tensor> outputs(Tensor hidden, const MicroBatch& mb) const;
  // A received list taken apart: the ids go into *mb, the hidden states are returned.
  Tensor take_inputs(std::vector<Tensor> received, MicroBatch* mb) const;
};

}  // namespace gale
