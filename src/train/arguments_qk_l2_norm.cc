// --qk-l2-norm (Megatron main's TransformerConfig.qk_l2_norm) and what it does not compose with.
#include "train/arguments.h"

namespace gale {

Status validate_qk_l2_norm(const Arguments& a) {
  const ModelArgs& m = a.model;
  if (!m.qk_l2_norm) return Status::Ok();
  if (m.multi_latent_attention)  // Megatron's layer specs assert it
    return InvalidArgument("--qk-l2-norm with --multi-latent-attention: qk_l2_norm is not supported with MLA "
                           "(Megatron normalises the heads of standard self-attention only)");
  if (!m.experimental_attention_variant.empty())
    return Unimplemented("--qk-l2-norm with --experimental-attention-variant ", m.experimental_attention_variant,
                         ": not supported yet");
  if (m.is_hybrid_model) return Unimplemented("--qk-l2-norm with --is-hybrid-model: not supported yet");
  if (a.parallel.tp_2d)
    return Unimplemented("--qk-l2-norm with --tp-2d: not supported yet (the 2-D attention layer is untested with it)");
  return Status::Ok();
}

}  // namespace gale
