// Megatron-Core's Gated DeltaNet mixer (--experimental-attention-variant gdn), forward and backward.
//
// In a GDN layer it replaces self-attention: x_mid = x_in + dropout(gdn(norm1(x_in))), the norm
// being Megatron's fused in_proj.layer_norm_weight (model/transformer_layer.h). T = S·B tokens,
// rows t = s·B + b; NK key heads and NV value heads (r = NV / NK) of DK and DV channels, a causal
// depthwise convolution of width K (Megatron's GatedDeltaNet, megatron/core/ssm/gated_delta_net):
//   [q | k | v | z | b | a] = u · in_projᵀ     in_proj [2·NK·DK + 2·NV·DV + 2·NV, H], no bias
//   [q | k | v] = silu(conv(q | k | v))        model/causal_conv1d.h, no bias
//   q, k ← q / √(Σq² + 1e-6), k / √(Σk² + 1e-6) per key head (FLA's l2norm)
//   value head h reads key head h / r (Megatron's repeat_interleave)
//   g_h = −exp(A_log_h)·softplus(a_h + dt_bias_h),  β_h = sigmoid(b_h)
//   the gated delta rule per (sample, value head), state S_s [DK, DV] (S_{−1} = 0):
//     S' = exp(g_s)·S_{s−1};  S_s = S' + k_s ⊗ β_s·(v_s − S'ᵀ k_s);  o_s = S_sᵀ q_s / √DK
//   y = RMSNorm_DV(o)·w ⊙ silu(z)              per head over DV (eps --norm-epsilon), weight out_norm.weight [DV]
//   out = y · out_projᵀ                         out_proj [H, NV·DV], no bias
// The recurrence is the level-0 reference: sequential over s, one (sample, value head) at a time.
// Backward runs it again keeping the state at every 64th position only, then, chunk by chunk from
// the end, recomputes the chunk's states and runs the adjoint recurrence backwards.
//
// Parameter names (Megatron-Core's state dict): decoder.layers.N.self_attention.in_proj.weight,
// conv1d.weight [2·NK·DK + NV·DV, K] (Megatron's [C, 1, K] without its unit dimension, as the
// Mamba mixer's), dt_bias [NV], A_log [NV], out_norm.weight [DV], out_proj.weight. Initial values
// as Megatron's: in_proj N(0, σ), out_proj N(0, σ/√(2L)), conv1d U(±1/√K) (PyTorch's default),
// dt_bias 1, A_log = log U(1, 16), out_norm 1 (0 with --apply-layernorm-1p). No tensor parallelism.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"
#include "model/linear.h"
#include "model/params.h"

namespace gale {

struct GdnDims {
  int64_t H = 0, NK = 0, NV = 0, DK = 0, DV = 0, K = 0;
  float norm_eps = 1e-5f;
  int64_t qk_dim() const { return NK * DK; }
  int64_t v_dim() const { return NV * DV; }
  int64_t conv_dim() const { return 2 * qk_dim() + v_dim(); }
  int64_t in_proj_rows() const { return 2 * qk_dim() + 2 * v_dim() + 2 * NV; }
  static GdnDims of(const ModelConfig& c);
};

// Ids of one GDN mixer's parameters (-1 where absent; the layer's norm is the layer's).
struct GdnParamIds {
  int in_proj = -1, conv_w = -1, dt_bias = -1, a_log = -1, out_norm_w = -1, out_proj = -1;
  bool defined() const { return in_proj >= 0; }
  std::vector<int> all() const;
};

GdnParamIds register_gdn_params(ParamBuffer& pb, const ModelConfig& c, int64_t layer);

// The mixer's weights as the kernels take them (null gradients: not accumulated). out_norm holds
// the norm's scale (1 + w with --apply-layernorm-1p).
struct GdnWeights {
  LinearWeight in_proj, out_proj;
  const float *conv_w = nullptr, *dt_bias = nullptr, *a_log = nullptr;
  std::vector<float> out_norm;
  float *g_conv_w = nullptr, *g_dt_bias = nullptr, *g_a_log = nullptr, *g_out_norm = nullptr;
};
GdnWeights gdn_weights(const ModelConfig& c, const ParamBuffer& pb, const GdnParamIds& w, SgemmFn gemm,
                       Bf16GemmFn bf16_gemm);

// What the mixer keeps for backward (one micro-batch).
struct GdnSaved {
  Tensor u;         // [T, H] the mixer's input (GEMM input type)
  Tensor zx;        // [T, in_proj_rows] in_proj's output
  Tensor conv_pre;  // [T, conv_dim] the convolution's output before SiLU
  Tensor o;         // [T, NV·DV] the recurrence's output
  Tensor rstd;      // [T, NV] the output norm's 1/rms per head
  Tensor normed;    // [T, NV·DV] out_proj's input (GEMM input type)
  bool defined() const { return u.defined(); }
};

// out [T, H] of u [T, H]. `saved` null: nothing kept.
Tensor gdn_forward(const GdnDims& d, const GdnWeights& w, const Tensor& u, int64_t S, int64_t B, DType gemm_dtype,
                   GdnSaved* saved);
// Decoding (model/mamba_state.h): one sequence's rows of the mixer's input, positions 0 .. length−1
// (after the ones its state has seen) at rows first + s·stride. conv_state [K−1, conv_dim] holds
// the convolution's last K−1 inputs (q | k | v before it) and rec_state [NV, DK, DV] the delta
// rule's state S per value head; the sequence continues from them and leaves them after its last
// position (both null: the state before position 0, nothing written back). length 1 is a decode
// step, O(1) in the positions already seen (Megatron's GatedDeltaNet ssm_decode: the convolution's
// causal_conv1d_update and one step of the recurrence); longer is prefill (ssm_prefill).
struct GdnSequence {
  int64_t first = 0, stride = 1, length = 0;
  float* conv_state = nullptr;
  float* rec_state = nullptr;
};
// out [T, H] of u [T, H], whose rows the sequences cover exactly once (inference: nothing kept).
// gdn_forward is this with sample b's rows b, b + B, ... and no states.
Tensor gdn_forward_sequences(const GdnDims& d, const GdnWeights& w, const Tensor& u,
                             const std::vector<GdnSequence>& seqs, DType gemm_dtype);
// d_u [T, H] of d_out [T, H]; accumulates the parameter gradients; releases `saved`.
Tensor gdn_backward(const GdnDims& d, const GdnWeights& w, GdnSaved& saved, const Tensor& d_out, int64_t S, int64_t B);

}  // namespace gale
