// --softmax-type (Megatron-Core's TransformerConfig.softmax_type: attention sinks) and what it does not compose with yet.
#include "train/arguments.h"

namespace gale {

void add_softmax_type_args(ArgParser& p, ModelArgs& a) {
  p.add_choice("--softmax-type", &a.softmax_type, {"vanilla", "off-by-one", "learnable"},
               "attention softmax (Megatron-Core's softmax_type; attention sinks as in gpt-oss): vanilla; "
               "off-by-one adds a zero logit to every row (exp(x_i) / (1 + sum_j exp(x_j))); learnable adds a "
               "learned logit per head, the parameter self_attention.core_attention.softmax_offset [heads]");
}

Status validate_softmax_type(const Arguments& a) {
  const ModelArgs& m = a.model;
  if (m.softmax_type == "vanilla") return Status::Ok();
  const std::string flag = "--softmax-type " + m.softmax_type;
  // Gated DeltaNet layers have no softmax (the model's attention layers take the sinks); DSA's sparse
  // kernels do not take them yet.
  if (m.experimental_attention_variant == "dsa")
    return Unimplemented(flag, " with --experimental-attention-variant dsa: not supported yet (DeepSeek sparse "
                         "attention's kernels)");
  if (a.parallel.tp_2d)
    return Unimplemented(flag, " with --tp-2d: not supported yet (the 2-D attention layer's head split)");
  return Status::Ok();
}

}  // namespace gale
