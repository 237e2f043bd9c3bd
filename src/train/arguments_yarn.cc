// YaRN RoPE for standard attention (--position-embedding-type yarn; Megatron-Core's flags and defaults) and its checks.
#include "train/arguments.h"

#include <cmath>
#include <utility>

namespace gale {

void add_yarn_args(ArgParser& p, ModelArgs& a) {
  // Megatron lists these three with MLA's flags; both YaRNs read them (and generate needs them).
  p.add("--rotary-scaling-factor", &a.rotary_scaling_factor,
        "YaRN's scaling factor s, of MLA's or --position-embedding-type yarn (1: plain RoPE; model/yarn_rope.h)");
  p.add("--mscale", &a.mscale, "YaRN's mscale (cos/sin concentration m(s, mscale) / m(s, mscale-all-dim))");
  p.add("--mscale-all-dim", &a.mscale_all_dim, "YaRN's mscale_all_dim (with MLA also the softmax scale times m(s, this)^2)");
  p.add("--yarn-original-max-position-embeddings", &a.yarn_original_max_position_embeddings,
        "--position-embedding-type yarn: the context the model was trained at, where the frequency correction "
        "range is found (unset: 4096)");
  p.add("--yarn-beta-fast", &a.yarn_beta_fast,
        "--position-embedding-type yarn: rotations at which frequencies stop being kept (unset: 32)");
  p.add("--yarn-beta-slow", &a.yarn_beta_slow,
        "--position-embedding-type yarn: rotations below which frequencies are fully interpolated (unset: 1)");
  p.add_flag("--yarn-correction-range-round-to-int", &a.yarn_correction_range_round_to_int,
             "--position-embedding-type yarn: round the correction range's ends to integers (the default)");
  p.add_false("--no-yarn-correction-range-round-to-int", &a.yarn_correction_range_round_to_int,
              "--position-embedding-type yarn: keep the correction range's ends fractional");
}

Status validate_yarn_args(const ModelArgs& m, const ArgParser& p) {
  const char* const yarn_flags[] = {"--yarn-original-max-position-embeddings", "--yarn-beta-fast", "--yarn-beta-slow",
                                    "--yarn-correction-range-round-to-int", "--no-yarn-correction-range-round-to-int"};
  if (m.position_embedding_type != "yarn") {
    for (const char* flag : yarn_flags)
      if (p.was_set(flag))
        return InvalidArgument(flag, " needs --position-embedding-type yarn, found ", m.position_embedding_type);
    return Status::Ok();
  }
  if (m.multi_latent_attention)
    return InvalidArgument("--position-embedding-type yarn with --multi-latent-attention: MLA's YaRN is --rope-type "
                           "yarn (its default), found both");
  if (!(m.rotary_scaling_factor >= 1.0))
    return InvalidArgument("--rotary-scaling-factor: expected at least 1 (YaRN's context extension), found ",
                           m.rotary_scaling_factor);
  // Megatron's YarnRotaryEmbedding takes its frequencies over the whole --kv-channels and asserts
  // halves rotation: a partial or interleaved rotation would not be what the flags say.
  if (m.rotary_percent != 1.0)
    return InvalidArgument("--rotary-percent: expected 1 with --position-embedding-type yarn (YaRN rotates the whole "
                           "head, as Megatron's YarnRotaryEmbedding), found ", m.rotary_percent);
  if (m.rotary_interleaved)
    return InvalidArgument("--rotary-interleaved with --position-embedding-type yarn: YaRN rotates halves (Megatron "
                           "asserts so), found --rotary-interleaved");
  if (m.kv_channels != kUnset && m.kv_channels % 2 != 0)
    return InvalidArgument("--kv-channels: expected an even head dimension with --position-embedding-type yarn "
                           "(RoPE rotates pairs), found ", m.kv_channels);
  if (m.rotary_base <= 0) return InvalidArgument("--rotary-base: expected a positive integer, found ", m.rotary_base);
  if (m.yarn_original_max_position_embeddings != kUnset && m.yarn_original_max_position_embeddings <= 0)
    return InvalidArgument("--yarn-original-max-position-embeddings: expected a positive integer, found ",
                           m.yarn_original_max_position_embeddings);
  for (const auto& [flag, value] : {std::pair{"--yarn-beta-fast", m.yarn_beta_fast}, {"--yarn-beta-slow", m.yarn_beta_slow}})
    if (!unset(value) && !(value > 0.0))
      return InvalidArgument(flag, ": expected a positive number of rotations, found ", value);
  // m(s, x) = 0.1·x·ln(s) + 1 divides cos/sin: it must not vanish.
  if (m.rotary_scaling_factor > 1.0 && !(0.1 * m.mscale_all_dim * std::log(m.rotary_scaling_factor) + 1.0 > 0.0))
    return InvalidArgument("--mscale-all-dim: expected 0.1 x --mscale-all-dim x ln(--rotary-scaling-factor) + 1 > 0 "
                           "(it divides YaRN's cos/sin), found --mscale-all-dim ", m.mscale_all_dim);
  return Status::Ok();
}

}  // namespace gale
