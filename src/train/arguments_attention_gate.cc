// --attention-output-gate (Megatron-Core's attention_output_gate) and what it does not compose with yet.
#include "train/arguments.h"

namespace gale {

Status validate_attention_output_gate(const Arguments& a) {
  const ModelArgs& m = a.model;
  if (!m.attention_output_gate) return Status::Ok();
  if (m.multi_latent_attention)
    return InvalidArgument("--attention-output-gate with --multi-latent-attention: MLA has no linear_qkv to hold the "
                           "gate (Megatron gates standard self-attention only)");
  if (a.parallel.tp_2d)
    return Unimplemented("--attention-output-gate with --tp-2d: not supported yet (the 2-D linear_qkv blocks)");
  for (const std::string& t : a.lora.lora_target_modules)
    if (t == "linear_qkv")
      return Unimplemented("--attention-output-gate with --lora-target-modules linear_qkv: not supported yet");
  if (a.training.optimizer == "muon")
    return Unimplemented("--attention-output-gate with --optimizer muon: not supported yet (Muon's per-group QKV "
                         "split)");
  return Status::Ok();
}

}  // namespace gale
