// YaRN rotary tables (Megatron-Core's YarnRotaryEmbedding): --position-embedding-type yarn, and MLA's rope_type yarn.
//
// With scaling factor s > 1 the inverse frequencies of a rotary width R blend the original ones
// (inv_extra[i] = base^(−2i/R)) with interpolated ones (inv_inter[i] = inv_extra[i] / s):
//   d(n) = R·ln(original_max_positions / (2π·n)) / (2·ln base),
//   low  = max(d(beta_fast), 0), high = min(d(beta_slow), R − 1), with d rounded down and up
//          first when round_to_int (Megatron's default),
//   ramp[i] = clamp((i − low) / (high − low), 0, 1)  (high += 0.001 when equal), i < R/2,
//   inv[i]  = inv_inter[i]·ramp[i] + inv_extra[i]·(1 − ramp[i]),
// and cos/sin are multiplied by the concentration factor m(s, mscale) / m(s, mscale_all_dim) with
// m(s, x) = 0.1·x·ln(s) + 1 (1 when s ≤ 1). With s = 1 every factor is 1 and this is plain RoPE.
// MLA also scales its softmax by m(s, mscale_all_dim)² (MlaConfig::softmax_scale); standard
// attention keeps 1/sqrt(head_dim), as Megatron's GPTModel does.
#pragma once

#include <cstdint>

#include "kernels/cpu/rope.h"
#include "model/config.h"

namespace gale {

// m(s, x) above (Megatron's _yarn_get_mscale).
double yarn_mscale(double scale, double mscale);

// Rotary tables [max_positions, rot_dim/2] of YaRN `y` (y.scaling_factor ≤ 1: plain RoPE's,
// make_rope_tables). rot_dim is even.
RopeTables make_yarn_rope_tables(const YarnConfig& y, int64_t max_positions, int64_t rot_dim, double base);

// Rotary tables of `mla`'s rotary part (qk_pos_emb_head_dim): with rope_type yarn YaRN's with MLA's
// scaling factor, mscale and mscale_all_dim and YarnConfig's other defaults; with rope_type rope
// plain RoPE whatever the scaling factor (which then changes only MLA's softmax scale), as Megatron.
RopeTables make_mla_rope_tables(const MlaConfig& mla, int64_t max_positions, double base);

}  // namespace gale
