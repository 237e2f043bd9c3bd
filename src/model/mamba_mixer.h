// The Mamba-2 mixer and the Mamba layer of Megatron's hybrid model (--is-hybrid-model), forward and backward.
//
// Mamba layer (Megatron's MambaLayer; global layer `layer`, T = S·B tokens, row t = s·B + b):
//   u = norm(x_in)                                  --normalization, weight mixer.in_proj.layer_norm_weight
//   x_out = x_in + dropout(mixer(u))                hidden dropout (site 2 of the layer's streams)
// Mixer (Megatron's MambaMixer, Mamba-2; DI = expand·H, NH = DI / P heads of P = headdim channels,
// G groups of B and C of N = d_state each, head h reads group h / (NH/G), K = d_conv):
//   [z | xBC | dt] = u · in_projᵀ                   in_proj [2·DI + 2·G·N + NH, H], no bias
//   xBC = silu(conv(xBC))                           causal depthwise convolution along s per sample:
//                                                   c_s = bias + Σ_k w[k]·xBC_{s−K+1+k} (zero before s = 0)
//   [x | B | C] = xBC                               x [DI] = NH heads × P, B and C [G·N]
//   Δ_h = softplus(dt_h + dt_bias_h), A_h = −exp(A_log_h)
//   state_s = exp(Δ_s·A)·state_{s−1} + Δ_s·x_s ⊗ B_s     [P, N] per head (state_{−1} = 0)
//   y_s = state_s·C_s + D_h·x_s                     the selective state-space scan (SSD recurrence)
//   g = y·silu(z); n = RMSNorm_grouped(g)·w         norm over groups of DI/G channels, eps 1e-5
//                                                   (Megatron's RMSNormGated, norm_before_gate false)
//   out = n · out_projᵀ                             out_proj [H, DI], no bias
// The scan is the level-0 reference: sequential over s, one (sample, head) at a time. Its backward
// recomputes the states forward (nothing of size S·P·N is kept) and runs the adjoint recurrence
// dstate_s = dy_s ⊗ C_s + exp(Δ_{s+1}·A)·dstate_{s+1} backwards.
//
// --mamba-training-ssm-states-dtype bf16 (or f16; MambaMixerWeights::ssm_states): Megatron's
// training kernel (mamba_ssm's chunked SSD scan, chunks of Q = 128 positions) materialises the
// state entering each chunk c (the state after position c·Q − 1) in that dtype and computes the
// chunk's outputs from it, while the chunk-to-chunk recurrence itself runs in f32. The sequential
// scan does the same: y_s = (state_s + decay_s·E_c)·C_s + D_h·x_s, E_c = stored(state_{c·Q−1}) −
// state_{c·Q−1} (0 in chunk 0), decay_s = Π_{c·Q ≤ j ≤ s} exp(Δ_j·A), state_s the f32 recurrence.
// Backward treats the rounding as the identity (a cast's derivative) and differentiates the rest
// exactly. Only the training forward (mamba_mixer_forward) rounds; decoding with states does not.
//
// Parameter names (Megatron-Core's state dict): decoder.layers.N.mixer.in_proj.layer_norm_weight
// (and .layer_norm_bias with LayerNorm), mixer.in_proj.weight, mixer.conv1d.weight [DI + 2GN, 1, K],
// mixer.conv1d.bias, mixer.A_log [NH], mixer.D [NH], mixer.dt_bias [NH], mixer.norm.weight [DI],
// mixer.out_proj.weight. Initial values as Megatron's: in_proj N(0, σ), out_proj N(0, σ/√L),
// conv1d weight and bias U(±1/√K), A_log = log U(1, 16), dt_bias = softplus⁻¹(Δ0) with
// Δ0 = max(exp(U(log 0.001, log 0.1)), 1e-4), D and the norms 1.
//
// Tensor parallelism (Megatron's MambaMixer at TP > 1; TP divides G, hence NH and DI): each rank
// holds NH/TP heads and G/TP groups. in_proj is column-parallel with each of its parts split on
// its own: the local rows are [z_r | x_r | B_r | C_r | dt_r] (rank r's DI/TP, DI/TP, G·N/TP,
// G·N/TP, NH/TP rows of each part), the global tensor stays [z | x | B | C | dt]; conv1d splits
// x|B|C the same way, A_log, D, dt_bias by head and norm.weight by channel; out_proj is
// row-parallel. A rank's heads read only its own groups and the gated norm's groups lie inside
// one rank, so the mixer needs no communication besides the two linears' (model/tp_linear.h):
// under --sequence-parallel in_proj all-gathers its input along the sequence and out_proj
// reduce-scatters its output, else out_proj all-reduces. The pre-norm is replicated (its
// gradient all-reduced over TP under SP, as the transformer layers' norms).
//
// Context parallelism (Megatron's MambaContextParallel; model/mamba_context_parallel.h): in_proj,
// the gated norm and out_proj run on this cp rank's positions; between them an all-to-all over the
// cp group hands each rank whole sequences of 1/CP of the heads for the convolution and the scan,
// and the reverse all-to-all brings their gated output y·silu(z) back to the sequence split.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"
#include "model/layer_runtime.h"
#include "model/linear.h"
#include "model/params.h"
#include "model/tp_linear.h"
#include "parallel/context_split.h"

namespace gale {

struct MambaDims {
  int64_t H = 0, DI = 0, NH = 0, P = 0, G = 0, N = 0, K = 0;
  int64_t conv_dim() const { return DI + 2 * G * N; }
  int64_t in_proj_rows() const { return 2 * DI + 2 * G * N + NH; }
  static MambaDims of(const ModelConfig& c);
  // One TP rank's share of `tp`: DI, NH and G divided by tp (H, P, N, K whole).
  MambaDims tp_local(int64_t tp) const;
};

// Ids of one Mamba layer's parameters (-1 where absent).
struct MambaParamIds {
  int norm_w = -1, norm_b = -1, in_proj = -1, conv_w = -1, conv_b = -1, a_log = -1, d = -1, dt_bias = -1,
      gnorm_w = -1, out_proj = -1;
  bool defined() const { return in_proj >= 0; }
  std::vector<int> all() const;
};

// `part` null: TP 1; else the parameters split over part->tp as above.
MambaParamIds register_mamba_params(ParamBuffer& pb, const ModelConfig& c, int64_t layer,
                                    const ModelPartition* part = nullptr);

// The mixer's context parallelism (model/mamba_context_parallel.h): the cp group and the micro-batch's
// split of the sequence over it; null group: none.
struct MambaCpComm {
  Communicator* group = nullptr;
  const ContextSplit* split = nullptr;
  bool on() const { return group != nullptr && group->size() > 1; }
};

// The mixer's weights as the kernels take them: the two linears, and the small parameters with
// their gradients (null gradients: not accumulated).
struct MambaMixerWeights {
  LinearWeight in_proj, out_proj;
  const float *conv_w = nullptr, *conv_b = nullptr, *a_log = nullptr, *d = nullptr, *dt_bias = nullptr,
              *gnorm_w = nullptr;
  float *g_conv_w = nullptr, *g_conv_b = nullptr, *g_a_log = nullptr, *g_d = nullptr, *g_dt_bias = nullptr,
        *g_gnorm_w = nullptr;
  TpLinearComm tp;  // in_proj column-, out_proj row-parallel over tp.tp (null: TP 1, plain linears)
  MambaCpComm cp;   // the all-to-alls around the convolution and the scan (null group: CP 1)
  // --mamba-training-ssm-states-dtype: the dtype of the states entering each chunk of `chunk`
  // positions (kF32: none rounded; see mamba_mixer_forward).
  DType ssm_states = DType::kF32;
  int64_t chunk = 128;
};
MambaMixerWeights mamba_mixer_weights(const ParamBuffer& pb, const MambaParamIds& w, SgemmFn gemm,
                                      Bf16GemmFn bf16_gemm);

// What the mixer keeps for backward (one micro-batch). Under context parallelism zxbcdt, conv_pre and
// y are those of the whole sequences' [S_global·B] rows and this cp rank's heads (DI, G, NH of
// mamba_cp_local), the others this rank's positions.
struct MambaMixerSaved {
  Tensor u;         // [T, H] in_proj's input (GEMM input type; gathered under SP)
  Tensor zxbcdt;    // [T, in_proj_rows] in_proj's output (CP: after the all-to-all)
  Tensor conv_pre;  // [T, conv_dim] the convolution's output before SiLU
  Tensor y;         // [T, DI] the scan's output (D skip included)
  Tensor gated;     // CP only: [T, DI] the gated norm's input y·silu(z) (without CP recomputed)
  Tensor rstd;      // [T, G] the gated norm's 1/rms per group
  Tensor normed;    // [T, DI] out_proj's input (GEMM input type)
  std::vector<int32_t> starts;  // packed sequences: each scan row's document start (empty: none)
};

// out [T, H] of u [T, H] (rows t = s·B + b; `d` this TP rank's dims, MambaDims::tp_local). Under
// sequence parallelism u and out are this rank's [T/TP, H] rows; under context parallelism (w.cp)
// S is this cp rank's share of the sequence. `saved` null: nothing kept.
// Packed sequences (model/document_starts.h): `starts` [S_run·B] (S_run the whole sequence's
// length under CP) gives each scan row its document's first position; the convolution reads
// nothing before it and the scan restarts there from the zero state (mamba_ssm's seq_idx), in
// forward and backward. With --mamba-training-ssm-states-dtype the chunks stay those of the whole
// row (positions c·Q), the stored entering state no longer reaching past a document's start.
Tensor mamba_mixer_forward(const MambaDims& d, const MambaMixerWeights& w, const Tensor& u, int64_t S, int64_t B,
                           DType gemm_dtype, MambaMixerSaved* saved, const std::vector<int32_t>& starts = {});

// One sequence's rows of the mixer's input: positions 0 .. length−1 (after the ones its state has
// seen) are rows first + s·stride. With a decoding state (model/mamba_state.h; both null: the state
// before position 0, and nothing written back) the convolution reads the last K−1 inputs from
// conv_state [K−1, CD] before position 0 and the scan starts from ssm_state [NH, P, N]; both are
// then replaced by those after the last position. length 1 is the single-token recurrence of a
// decode step (mamba_ssm's causal_conv1d_update and selective_state_update):
//   c = bias + Σ_{k<K−1} w[k]·conv_state[k] + w[K−1]·xBC;  conv_state ← [conv_state[1..], xBC]
//   state ← exp(Δ·A)·state + Δ·x ⊗ B;  y = state·C + D·x
// conv_steps [length, max(K−1, 1), CD] and ssm_steps [length, NH, P, N] (speculative decoding's
// rollback; null: not kept) get the states after each position s, those the sequence would hold
// had it ended there (Megatron's intermediate Mamba states of speculative decoding).
struct MambaSequence {
  int64_t first = 0, stride = 1, length = 0;
  float* conv_state = nullptr;
  float* ssm_state = nullptr;
  float* conv_steps = nullptr;
  float* ssm_steps = nullptr;
};
// out [T, H] of u [T, H], whose rows the sequences cover exactly once (inference: nothing kept for
// backward; no context parallelism). mamba_mixer_forward is this with sample b's rows b, b + B, ...
// and no states.
Tensor mamba_mixer_forward_sequences(const MambaDims& d, const MambaMixerWeights& w, const Tensor& u,
                                     const std::vector<MambaSequence>& seqs, DType gemm_dtype);
// d_u [T, H] of d_out [T, H]; accumulates the parameter gradients; releases `saved`.
Tensor mamba_mixer_backward(const MambaDims& d, const MambaMixerWeights& w, MambaMixerSaved& saved,
                            const Tensor& d_out, int64_t S, int64_t B);

// The Mamba layer (norm + mixer + residual). In inference forwards with rt.kv_cache (sample b's
// state in slot b of its `mamba` pool) or rt.ragged_kv (request r's rows in its `mamba_slot`) the
// mixer continues each sequence from its decoding state and leaves the state after its new rows.
struct MambaLayerSaved {
  Tensor x_in;        // [T, H]
  Tensor norm_stats;  // the pre-norm's statistics
  MambaMixerSaved mixer;
  bool defined() const { return x_in.defined(); }
};
Tensor mamba_layer_forward(const LayerRuntime& rt, const ParamBuffer& pb, const MambaParamIds& w, int64_t layer,
                           const Tensor& x_in, MambaLayerSaved* saved);
Tensor mamba_layer_backward(const LayerRuntime& rt, ParamBuffer& pb, const MambaParamIds& w, int64_t layer,
                            MambaLayerSaved& saved, const Tensor& d_out);

}  // namespace gale
