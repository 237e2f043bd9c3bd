// YaRN rotary tables for multi-latent attention (Megatron-Core's YarnRotaryEmbedding, rope_type yarn).
//
// With scaling factor s > 1 the rotary part's inverse frequencies blend the original ones
// (inv_extra[i] = base^(−2i/R)) with interpolated ones (inv_inter[i] = inv_extra[i] / s):
//   low  = max(floor(d(beta_fast)), 0), high = min(ceil(d(beta_slow)), R − 1),
//   d(n) = R·ln(original_max_positions / (2π·n)) / (2·ln base),
//   ramp[i] = clamp((i − low) / (high − low), 0, 1)  (high += 0.001 when equal), i < R/2,
//   inv[i]  = inv_inter[i]·ramp[i] + inv_extra[i]·(1 − ramp[i]),
// and cos/sin are multiplied by the concentration factor m(s, mscale) / m(s, mscale_all_dim) with
// m(s, x) = 0.1·x·ln(s) + 1 (1 when s ≤ 1). The attention scale becomes m(s, mscale_all_dim)² /
// sqrt(Dn + R) (ModelConfig::softmax_scale). With s = 1 every factor is 1 and this is plain RoPE.
// original_max_positions, beta_fast and beta_slow are MLATransformerConfig's defaults (4096, 32,
// 1): Megatron has no flags for them in the MLA path.
#pragma once

#include <cstdint>

#include "kernels/cpu/rope.h"
#include "model/config.h"

namespace gale {

// m(s, x) above (Megatron's _yarn_get_mscale).
double yarn_mscale(double scale, double mscale);

// Rotary tables [max_positions, R/2] of `mla`'s rotary part with base `base`: YaRN's when
// mla.rotary_scaling_factor > 1, else plain RoPE's (make_rope_tables).
RopeTables make_mla_rope_tables(const MlaConfig& mla, int64_t max_positions, double base);

}  // namespace gale
