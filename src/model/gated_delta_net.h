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
// dt_bias 1, A_log = log U(1, 16), out_norm 1 (0 with --apply-layernorm-1p).
//
// Tensor parallelism (Megatron's GatedDeltaNet at TP > 1; TP divides NK and NV): each rank holds
// NK/TP key heads and NV/TP value heads (value head h still reads key head h / r). in_proj is
// column-parallel with each of its six sections split on its own: the local rows are
// [q_r | k_r | v_r | z_r | b_r | a_r] (rank r's NK·DK/TP, NK·DK/TP, NV·DV/TP, NV·DV/TP, NV/TP, NV/TP
// rows of each section; the global tensor stays [q | k | v | z | b | a], Megatron's sharded
// in_proj.weight split into query, key, value, z, beta, alpha); conv1d.weight splits q | k | v the
// same way, dt_bias and A_log by value head; out_norm.weight [DV] is replicated (every head's norm
// shares it: its gradient is summed over TP); out_proj is row-parallel. The heads of a rank read only
// that rank's channels, so the mixer needs no communication besides the two linears'
// (model/tp_linear.h): under --sequence-parallel in_proj all-gathers its input along the sequence
// and out_proj reduce-scatters its output, else out_proj all-reduces. The layer's pre-norm is
// replicated as the transformer layers' norms.
//
// GDN2 (--experimental-attention-variant gdn2, Megatron-Core's GatedDeltaNet2; GdnDims::gdn2) keeps
// everything above but the gates, which become channel-wise and decouple erase from write:
//   [q | k | v | z | f | b | w] = u · in_projᵀ in_proj [4·NK·DK + 3·NV·DV, H] (f, b: NK·DK; w: NV·DV)
//   g = −exp(A_log_kh)·softplus(f + dt_bias)  per key channel (A_log [NK] per key head, dt_bias [NK·DK])
//   e = sigmoid(b) per key channel (erase), ω = sigmoid(w) per value channel (write)
//   value head h reads key head h / r's q, k, g and e (Megatron's repeat_interleave), its own ω
//     P = Diag(exp(g_s))·S_{s−1};  S_s = P + k_s ⊗ (ω_s ⊙ v_s − Pᵀ(e_s ⊙ k_s));  o_s = S_sᵀ q_s / √DK
// (S_s = (I − k (e⊙k)ᵀ) Diag(exp g) S_{s−1} + k (ω⊙v)ᵀ, Megatron's docstring). GDN is the case
// exp(g) = exp(g_h)·1, e = β·1, ω = β·1, so one channel-wise kernel runs both. in_proj's sections
// split over TP on their own as above (Megatron's query, key, value, z, f, b, w); dt_bias splits by
// key channel and A_log by key head. dt_bias starts at softplus⁻¹(Δ0), Δ0 log-uniform in [1e-3, 0.1]
// (kMambaDtBias, Megatron's _reset_dt_bias). Megatron refuses GDN2 inference; Gale decodes it as GDN.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"
#include "model/linear.h"
#include "model/lora.h"
#include "model/mamba_mixer.h"
#include "model/params.h"
#include "model/tp_linear.h"

namespace gale {

struct GdnDims {
  int64_t H = 0, NK = 0, NV = 0, DK = 0, DV = 0, K = 0;
  float norm_eps = 1e-5f;
  // Gated DeltaNet-2's channel-wise gates (f, b, w sections; dt_bias per key channel, A_log per key
  // head): GdnDims::of sets it when the model's GdnConfig::pattern marks its GDN layers 2.
  bool gdn2 = false;
  int64_t qk_dim() const { return NK * DK; }
  int64_t v_dim() const { return NV * DV; }
  int64_t conv_dim() const { return 2 * qk_dim() + v_dim(); }
  int64_t in_proj_rows() const { return gdn2 ? 4 * qk_dim() + 3 * v_dim() : 2 * qk_dim() + 2 * v_dim() + 2 * NV; }
  int64_t dt_bias_dim() const { return gdn2 ? qk_dim() : NV; }
  int64_t a_log_dim() const { return gdn2 ? NK : NV; }
  // in_proj's sections in order (q, k, v, z, then β, α or f, b, w), each split over TP and CP on its own.
  std::vector<int64_t> in_proj_sections() const;
  static GdnDims of(const ModelConfig& c);
  // One TP rank's share of `tp`: NK and NV divided by tp (H, DK, DV, K whole).
  GdnDims tp_local(int64_t tp) const;
};

// Ids of one GDN mixer's parameters (-1 where absent; the layer's norm is the layer's).
struct GdnParamIds {
  int in_proj = -1, conv_w = -1, dt_bias = -1, a_log = -1, out_norm_w = -1, out_proj = -1;
  LoraIds lora_in, lora_out;  // LoRA adapters of in_proj / out_proj (--lora-target-modules in_proj out_proj)
  bool defined() const { return in_proj >= 0; }
  std::vector<int> all() const;
};

// `part` null: TP 1; else the parameters split over part->tp as above. With c.lora.in_proj /
// out_proj (CP 1; at TP > 1 in_proj's lora_B splits per section as in_proj, its lora_A is replicated
// and its input gradient reduced as in_proj's; out_proj's lora_A splits by columns, its partial
// output reduced as out_proj's) the projections
// gain LoRA adapters under peft's names ("...in_proj.lora_A.default.weight"); the rest is frozen.
GdnParamIds register_gdn_params(ParamBuffer& pb, const ModelConfig& c, int64_t layer,
                                const ModelPartition* part = nullptr);

// The mixer's weights as the kernels take them (null gradients: not accumulated). out_norm holds
// the norm's scale (1 + w with --apply-layernorm-1p).
struct GdnWeights {
  LinearWeight in_proj, out_proj;
  const float *conv_w = nullptr, *dt_bias = nullptr, *a_log = nullptr;
  std::vector<float> out_norm;
  float *g_conv_w = nullptr, *g_dt_bias = nullptr, *g_a_log = nullptr, *g_out_norm = nullptr;
  TpLinearComm tp;  // in_proj column-, out_proj row-parallel over tp.tp (null: TP 1, plain linears)
  MambaCpComm cp;   // the all-to-alls around the convolution and the recurrence (model/gdn_context_parallel.h; null group: CP 1)
  LoraWeights lora_in, lora_out;  // in_proj's / out_proj's adapter (a null: none; model/lora.h)
};
GdnWeights gdn_weights(const ModelConfig& c, const ParamBuffer& pb, const GdnParamIds& w, SgemmFn gemm,
                       Bf16GemmFn bf16_gemm);

// What the mixer keeps for backward (one micro-batch).
struct GdnSaved {
  Tensor u;         // [T, H] in_proj's input (GEMM input type; gathered under SP)
  Tensor zx;        // [T, in_proj_rows] in_proj's output
  Tensor conv_pre;  // [T, conv_dim] the convolution's output before SiLU
  Tensor o;         // [T, NV·DV] the recurrence's output
  Tensor rstd;      // [T, NV] the output norm's 1/rms per head
  Tensor normed;    // [T, NV·DV] out_proj's input (GEMM input type)
  Tensor lora_in_u, lora_out_u;  // the adapters' x·Aᵀ (model/lora.h), when adapted
  std::vector<int32_t> starts;   // packed sequences: each recurrence row's document start (empty: none)
  bool defined() const { return u.defined(); }
};

// out [T, H] of u [T, H] (rows t = s·B + b; `d` this rank's dims, GdnDims::tp_local). Under
// sequence parallelism u and out are this rank's [T/TP, H] rows; under context parallelism S is
// this cp rank's positions (w.cp.split's local length). `saved` null: nothing kept.
// Packed sequences (model/document_starts.h): `starts` [S_run·B] (S_run the whole sequence's
// length under CP) gives each row its document's first position; the convolution reads nothing
// before it and the delta rule restarts there from the zero state (FLA's cu_seqlens), in forward
// and backward.
Tensor gdn_forward(const GdnDims& d, const GdnWeights& w, const Tensor& u, int64_t S, int64_t B, DType gemm_dtype,
                   GdnSaved* saved, const std::vector<int32_t>& starts = {});
// Decoding (model/mamba_state.h): one sequence's rows of the mixer's input, positions 0 .. length−1
// (after the ones its state has seen) at rows first + s·stride. conv_state [K−1, conv_dim] holds
// the convolution's last K−1 inputs (q | k | v before it) and rec_state [NV, DK, DV] the delta
// rule's state S per value head; the sequence continues from them and leaves them after its last
// position (both null: the state before position 0, nothing written back). length 1 is a decode
// step, O(1) in the positions already seen (Megatron's GatedDeltaNet ssm_decode: the convolution's
// causal_conv1d_update and one step of the recurrence); longer is prefill (ssm_prefill).
// conv_steps [length, max(K−1, 1), conv_dim] and rec_steps [length, NV, DK, DV] (speculative
// decoding's rollback; null: not kept) get the states after each position s.
struct GdnSequence {
  int64_t first = 0, stride = 1, length = 0;
  float* conv_state = nullptr;
  float* rec_state = nullptr;
  float* conv_steps = nullptr;
  float* rec_steps = nullptr;
};
// out [T, H] of u [T, H], whose rows the sequences cover exactly once (inference: nothing kept; no
// sequence parallelism, no context parallelism).
// gdn_forward is this with sample b's rows b, b + B, ... and no states.
Tensor gdn_forward_sequences(const GdnDims& d, const GdnWeights& w, const Tensor& u,
                             const std::vector<GdnSequence>& seqs, DType gemm_dtype);
// d_u [T, H] of d_out [T, H] (this rank's rows under SP, summed over TP); accumulates the
// parameter gradients; releases `saved`.
Tensor gdn_backward(const GdnDims& d, const GdnWeights& w, GdnSaved& saved, const Tensor& d_out, int64_t S, int64_t B);

}  // namespace gale
