// The typed tensors a pipeline stage hands the next one (MindSpeed's multi-parameter pipeline).
//
// A transfer between adjacent virtual stages is a list of named tensors, each with its shape and
// element type; the ones marked `requires_grad` have their gradients travel back, in the same
// order, the others (ids, masks) only go forward. The plain pipeline's transfer is the list of one
// tensor, the f32 hidden states [Tl, H] (hidden_states_spec).
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"

namespace gale {

struct PipeTensorSpec {
  std::string name;
  Shape shape;
  DType dtype = DType::kF32;
  bool requires_grad = false;

  bool operator==(const PipeTensorSpec&) const = default;
};
using PipeTensorSpecs = std::vector<PipeTensorSpec>;

// The plain pipeline's one tensor: the hidden states of `shape`, f32, with a gradient.
PipeTensorSpec hidden_states_spec(const Shape& shape);

// The specs whose gradients travel back (those with requires_grad, in order), as the backward
// transfer's specs (same names, shapes and types).
PipeTensorSpecs gradient_specs(const PipeTensorSpecs& forward);

// "hidden_states f32 [32, 64] (grad), document_ids i32 [2, 16]": for error messages and the
// stages' agreement on what they exchange (PipelineP2P::agree_on_tensors).
std::string describe(const PipeTensorSpec& spec);
std::string describe(const PipeTensorSpecs& specs);

}  // namespace gale
