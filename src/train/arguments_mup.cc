// --use-mup and the --mup-* flags (Megatron-Core's MuP fields): parsed with Megatron's defaults and validated (train/mup.h applies them).
#include <cmath>

#include "train/arguments.h"
#include "train/mup.h"

namespace gale {

void add_mup_args(ArgParser& p, ModelArgs& a) {
  p.add_flag("--use-mup", &a.use_mup,
             "Megatron-Core's Maximal Update Parameterization (MuP): width-scaled initialisation, attention softmax "
             "scale, embedding and output multipliers and per-parameter learning rates (docs/model.md \"MuP\")");
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
  const ModelArgs& m = a.model;
  if (!m.use_mup) return Status::Ok();  // Megatron reads the --mup-* flags only with --use-mup
  // Megatron asserts "--mup-base-hidden-size must be positive." in TransformerConfig.__post_init__.
  if (m.mup_base_hidden_size != kUnset && m.mup_base_hidden_size <= 0)
    return InvalidArgument("--mup-base-hidden-size must be positive: expected an integer > 0, found ",
                           m.mup_base_hidden_size);
  // Megatron would take the square root of a negative base head dimension (a complex scale).
  if (!unset(m.mup_base_head_dim) && !(m.mup_base_head_dim > 0.0))
    return InvalidArgument("--mup-base-head-dim: expected a positive number (the softmax scale is its square root "
                           "over kv_channels^power), found ", m.mup_base_head_dim);
  for (const auto& [flag, v] : {std::pair{"--mup-embedding-mult", m.mup_embedding_mult},
                                std::pair{"--mup-output-mult", m.mup_output_mult},
                                std::pair{"--mup-attn-scale-power", m.mup_attn_scale_power}})
    if (!std::isfinite(v)) return InvalidArgument(flag, ": expected a finite number, found ", v);
  warn_mup(a);
  return Status::Ok();
}

}  // namespace gale
