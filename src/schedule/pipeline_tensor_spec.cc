// Typed pipeline transfer specs: the plain hidden-states spec, the gradient subset, descriptions.
#include "schedule/pipeline_tensor_spec.h"

namespace gale {

PipeTensorSpec hidden_states_spec(const Shape& shape) {
  return PipeTensorSpec{"hidden_states", shape, DType::kF32, /*requires_grad=*/true};
}

PipeTensorSpecs gradient_specs(const PipeTensorSpecs& forward) {
  PipeTensorSpecs out;
  for (const PipeTensorSpec& s : forward)
    if (s.requires_grad) out.push_back(s);
  return out;
}

std::string describe(const PipeTensorSpec& spec) {
  return spec.name + " " + dtype_name(spec.dtype) + " " + shape_string(spec.shape) + (spec.requires_grad ? " (grad)" : "");
}

std::string describe(const PipeTensorSpecs& specs) {
  if (specs.empty()) return "no tensors";
  std::string out;
  for (size_t i = 0; i < specs.size(); ++i) out += (i ? ", " : "") + describe(specs[i]);
  return out;
}

}  // namespace gale
