// The LoRA fine-tuning flags (MindSpeed-LLM names and defaults) and their checks.
#include "train/arguments.h"

namespace gale {

namespace {

const char* const kLoraTargets[] = {"linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"};

}  // namespace

void add_lora_args(ArgParser& p, LoraArgs& a) {
  p.group("lora");
  p.add("--lora-r", &a.lora_r, "LoRA rank r (MindSpeed-LLM default 16)");
  p.add("--lora-alpha", &a.lora_alpha, "LoRA alpha: the adapter's output is scaled by alpha / r (default 32)");
  p.add_list("--lora-target-modules", &a.lora_target_modules,
             "linears that get LoRA adapters: linear_qkv linear_proj linear_fc1 linear_fc2; LoRA is on when given");
  p.add("--lora-load", &a.lora_load,
        "checkpoint directory of the LoRA adapters (and their optimizer state) to resume from; gale convert merges it");
  p.add_unsupported("--lora-modules-to-save", "training whole modules next to the LoRA adapters");
  p.add_unsupported("--lora-fusion", "CCLoRA's fused communication");
  p.add_unsupported("--qlora", "QLoRA (quantised base weights)");
  p.add_compat("--lora-register-forward-hook", true,
               "the hooks make the embedding output require grad for PyTorch's autograd; Gale's backward is explicit");
  p.add_compat("--lora-ckpt-filter", false, "with LoRA Gale always saves only the adapters (docs/model.md)");
}

Status validate_lora_args(Arguments& a, const ArgParser& p) {
  LoraArgs& l = a.lora;
  if (l.lora_r < 0 || (l.enabled() && l.lora_r == 0))
    return InvalidArgument("--lora-r: expected a positive integer, found ", l.lora_r);
  if (l.lora_alpha <= 0) return InvalidArgument("--lora-alpha: expected a positive integer, found ", l.lora_alpha);
  for (const std::string& t : l.lora_target_modules) {
    if (t == "in_proj" || t == "out_proj")  // Megatron-Core's GatedDeltaNet (and MambaMixer) projections
      return Unimplemented("--lora-target-modules ", t, ": adapters on the Gated DeltaNet / Mamba projections are "
                           "not supported yet (expected linear_qkv, linear_proj, linear_fc1 or linear_fc2: a GDN "
                           "model's attention and MLP linears)");
    bool known = false;
    for (const char* k : kLoraTargets) known = known || t == k;
    if (!known)
      return InvalidArgument("--lora-target-modules: expected linear_qkv, linear_proj, linear_fc1 or linear_fc2, found ",
                             t);
  }
  if (!l.enabled()) {
    if (!l.lora_load.empty()) return InvalidArgument("--lora-load needs --lora-target-modules (the adapted linears)");
    return Status::Ok();
  }
  if (a.moe.enabled())
    return InvalidArgument("--lora-target-modules: LoRA with --num-experts (MoE layers) is not supported yet");
  (void)p;
  return Status::Ok();
}

}  // namespace gale
