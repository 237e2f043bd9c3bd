// --use-mup and the --mup-* flags (Megatron-Core's MuP fields): parsed with Megatron's defaults, --use-mup refused (not implemented yet).
#include "train/arguments.h"

namespace gale {

void add_mup_args(ArgParser& p, ModelArgs& a) {
  p.add_flag("--use-mup", &a.use_mup,
             "Megatron-Core's Maximal Update Parameterization (MuP): not supported yet (refused at start-up)");
  p.add("--mup-base-hidden-size", &a.mup_base_hidden_size,
        "MuP's base hidden size (width multiplier hidden / base; default: --hidden-size); read only with --use-mup");
  p.add("--mup-embedding-mult", &a.mup_embedding_mult, "MuP's embedding output multiplier; read only with --use-mup");
  p.add("--mup-output-mult", &a.mup_output_mult,
        "MuP's output logits multiplier (1.0: 1 / width multiplier); read only with --use-mup");
  p.add("--mup-base-head-dim", &a.mup_base_head_dim,
        "MuP's base head dimension (softmax scale sqrt(base) / kv_channels^power); read only with --use-mup");
  p.add("--mup-attn-scale-power", &a.mup_attn_scale_power,
        "MuP's attention scale power (1.0: 1 / kv_channels; 0.5: the standard scale); read only with --use-mup");
}

Status validate_mup(const Arguments& a) {
  if (!a.model.use_mup) return Status::Ok();  // Megatron reads the --mup-* flags only with --use-mup
  return Unimplemented("--use-mup: not supported yet (MuP's width-scaled initialisation, attention softmax scale, "
                       "embedding and output multipliers and per-parameter learning rates are not implemented)");
}

}  // namespace gale
