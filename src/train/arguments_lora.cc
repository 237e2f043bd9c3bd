// The LoRA fine-tuning flags (MindSpeed-LLM names and defaults) and their checks.
#include "train/arguments.h"

namespace gale {

namespace {

// MindSpeed-LLM's four, and Megatron-Core's GatedDeltaNet projections (self_attention.in_proj / out_proj).
const char* const kLoraTargets[] = {"linear_qkv", "linear_proj", "linear_fc1", "linear_fc2", "in_proj", "out_proj"};

}  // namespace

void add_lora_args(ArgParser& p, LoraArgs& a) {
  p.group("lora");
  p.add("--lora-r", &a.lora_r, "LoRA rank r (MindSpeed-LLM default 16)");
  p.add("--lora-alpha", &a.lora_alpha, "LoRA alpha: the adapter's output is scaled by alpha / r (default 32)");
  p.add_list("--lora-target-modules", &a.lora_target_modules,
             "linears that get LoRA adapters: linear_qkv linear_proj linear_fc1 linear_fc2, and in_proj out_proj (a "
             "Gated DeltaNet model's GDN projections); LoRA is on when given");
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
    // Megatron-Core's GatedDeltaNet projections: a GDN model's only (a hybrid model takes no LoRA;
    // Mamba's in_proj / out_proj are not adapted), at any TP (in_proj's lora_B split per section as
    // in_proj) and CP 1 (the adapters do not follow the mixer's context-parallel all-to-alls).
    if (t == "in_proj" || t == "out_proj") {
      if (a.model.experimental_attention_variant == "gdn2")
        return Unimplemented("--lora-target-modules ", t, " with --experimental-attention-variant gdn2: not supported "
                             "yet (LoRA adapts Gated DeltaNet's projections, not Gated DeltaNet-2's)");
      if (a.model.experimental_attention_variant != "gdn" && a.model.experimental_attention_variant != "gated_delta_net")
        return InvalidArgument("--lora-target-modules ", t, ": expected a Gated DeltaNet model (--experimental-"
                               "attention-variant gdn; the GDN mixer's projection), found none");
      if (a.parallel.context_parallel_size > 1)
        return Unimplemented("--lora-target-modules ", t, " with --context-parallel-size ",
                             a.parallel.context_parallel_size, ": not supported yet (expected 1: the adapters of the "
                             "Gated DeltaNet projections do not follow its context-parallel all-to-alls)");
    }
    bool known = false;
    for (const char* k : kLoraTargets) known = known || t == k;
    if (!known)
      return InvalidArgument("--lora-target-modules: expected linear_qkv, linear_proj, linear_fc1 or linear_fc2, found ",
                             t, " (a Gated DeltaNet model also takes in_proj, out_proj)");
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
