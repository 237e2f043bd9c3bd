// Rotary position embedding (Megatron's "rotate half", or interleaved pairs): reference kernels.
//
// The first R = rot_dim dimensions of every head rotate; the rest pass through. For a token at
// position p and i < R/2, θ_i = p·base^(−2i/R), the pair (a, b) = (x_i, x_{i+R/2}) (default), or
// (x_{2i}, x_{2i+1}) with tables.interleaved (Megatron's --rotary-interleaved), becomes
// (a·cos θ_i − b·sin θ_i, b·cos θ_i + a·sin θ_i).
// Applied in place to `heads` heads laid out by `layout` (e.g. q or k inside the packed QKV).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/head_layout.h"

namespace gale {

// cos/sin tables [max_positions, rot_dim/2], angles computed in double.
struct RopeTables {
  int64_t max_positions = 0;
  int64_t rot_dim = 0;
  std::vector<float> cos, sin;
  bool interleaved = false;  // rotate pairs (2i, 2i+1) instead of (i, i + rot_dim/2)
};
// Frequencies inv_freq_i = base^(−2i/rot_dim); with `llama3_scaling_factor` > 0 (Megatron's
// --use-rope-scaling --rope-scaling-factor) each one is rescaled by llama3_scaled_inv_freq. The
// angle at position p is p·position_scale·inv_freq_i (position_scale 1/f: Megatron's
// --rotary-seq-len-interpolation-factor f, linear position interpolation).
RopeTables make_rope_tables(int64_t max_positions, int64_t rot_dim, double base, double llama3_scaling_factor = 0.0,
                            double position_scale = 1.0);

// Llama 3.1's RoPE scaling with Megatron's fixed constants (low_freq_factor 1, high_freq_factor 4,
// original context 8192): with wavelength λ = 2π/f, f stays when λ < 8192/4, becomes f/factor when
// λ > 8192/1, and in between (1 − s)·f/factor + s·f with s = (8192/λ − 1)/(4 − 1).
double llama3_scaled_inv_freq(double inv_freq, double factor);

// x: tokens t = s·B + b for s < S, b < B; position of (s, b) is position_ids[b·S + s].
void rope_forward_ref(float* x, const HeadLayout& layout, int64_t heads, int64_t S, int64_t B, int64_t HD,
                      const int32_t* position_ids, const RopeTables& tables);
// The transpose (rotation by −θ), applied in place to the gradient.
void rope_backward_ref(float* dx, const HeadLayout& layout, int64_t heads, int64_t S, int64_t B, int64_t HD,
                       const int32_t* position_ids, const RopeTables& tables);

}  // namespace gale
