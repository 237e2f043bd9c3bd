// One pre-norm transformer layer (attention + MLP) with explicit forward and backward.
//
// Shapes (T = S·B tokens, Tl = T/TP with sequence parallelism else T; NHl, KVl, Fl = this TP
// rank's heads, KV heads and FFN columns, model/layer_shares.h: uneven under --unaligned-linear):
//   x_in [Tl, H] -> norm1 -> (SP all-gather) [T, H] -> linear_qkv [T, (NHl+2KVl)·HD]
//   -> (--qk-layernorm: q_layernorm / k_layernorm on every q and k head over HD) -> RoPE
//   -> attention [T, NHl·HD] -> linear_proj (row-parallel, all-reduce / SP reduce-scatter) [Tl, H]
//   -> x_mid = x_in + dropout(. + b_proj) -> norm2 -> (SP all-gather) -> linear_fc1 [T, Fl or 2Fl]
//   -> GeLU / SwiGLU [T, Fl] -> linear_fc2 (row-parallel) [Tl, H] -> x_out = x_mid + dropout(. + b_fc2)
// With --multi-latent-attention the span from norm1 to attention is model/mla_attention.h (down
// projections on the Tl local rows, latents gathered, up projections over heads).
// With --experimental-attention-variant gdn the layers it selects replace the span from norm1's output
// to linear_proj's by model/gated_delta_net.h's mixer (no bias; its heads split over TP, in_proj
// column- and out_proj row-parallel, so the SP all-gather and reduce-scatter sit where linear_qkv's
// and linear_proj's do; decoding continues each sequence from its state in the KvCache's or ragged
// batch's slots, model/mamba_state.h).
// With context parallelism T = S·B counts this cp rank's positions only, and attention exchanges
// keys and values (or trades the sequence split for a head split) over the cp group:
// model/core_attention.h.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"
#include "model/core_attention.h"
#include "model/gated_delta_net.h"
#include "model/hyper_connection.h"
#include "model/layer_runtime.h"
#include "model/lora.h"
#include "model/mamba_mixer.h"
#include "model/mla_attention.h"
#include "model/moe_layer.h"
#include "model/moe_shared_expert.h"
#include "model/params.h"

namespace gale {

// Ids of one layer's parameters in the ParamBuffer (-1 when the model has no such parameter).
struct LayerParamIds {
  int norm1_w = -1, norm1_b = -1, qkv_w = -1, qkv_b = -1, proj_w = -1, proj_b = -1;
  int norm2_w = -1, norm2_b = -1, fc1_w = -1, fc1_b = -1, fc2_w = -1, fc2_b = -1;
  // --qk-layernorm (standard attention): q_layernorm / k_layernorm over head_dim, [HD] each,
  // shared by all heads, so replicated over TP with a gradient partial per TP rank (all-reduced over TP)
  int q_norm_w = -1, q_norm_b = -1, k_norm_w = -1, k_norm_b = -1;
  // --softmax-type learnable: self_attention.core_attention.softmax_offset [NH], one sink logit per
  // query head, split over TP with the heads (AttentionProblem::softmax_offset)
  int softmax_offset = -1;
  // --post-norm (Gemma-2's sandwich norms, MindSpeed-LLM's names): post_attn_norm after linear_proj and
  // post_mlp_layernorm after linear_fc2, [H] each (the model's norm type; biases with LayerNorm),
  // replicated over TP like norm1/norm2 (with SP their gradient is all-reduced over TP).
  int post_attn_norm_w = -1, post_attn_norm_b = -1, post_mlp_norm_w = -1, post_mlp_norm_b = -1;
  MlaParamIds mla;  // --multi-latent-attention: the latent projections instead of linear_qkv
  MoeParamIds moe;  // a MoE layer (config.moe.is_moe_layer): router and experts instead of fc1/fc2
  SharedExpertIds shared;  // a MoE layer's shared expert (--moe-shared-expert-intermediate-size)
  LoraIds lora_qkv, lora_proj, lora_fc1, lora_fc2;  // --lora-target-modules adapters (model/lora.h)
  MambaParamIds mamba;  // --is-hybrid-model: a Mamba layer ('M'; model/mamba_mixer.h) has only these
  // Heterogeneous layers' linear replacements (ModelConfig::hetero, SubBlock::kLinear): W [H, H]
  // column-parallel (its output gathered over TP) and its bias, instead of attention / the MLP.
  int linear_attn_w = -1, linear_attn_b = -1, linear_mlp_w = -1, linear_mlp_b = -1;
  GdnParamIds gdn;      // --experimental-attention-variant gdn: a GDN layer's mixer instead of qkv / proj
  // --enable-mhc-connections: the hyper-connection modules around attention and the MLP (model/mhc_layer.h)
  HyperConnectionIds hc_attn, hc_mlp;
  std::vector<int> all() const;  // every id of the layer, in registration order
};

// Registers the parameters of global layer `layer` (its MLP a MoE MLP where config.moe says so) with their
// Megatron names, TP splits and init.
// A --noop-layers layer registers none (every id -1); its forward and backward are the identity.
// A Mamba layer of --is-hybrid-model registers only LayerParamIds::mamba; its forward and backward
// are model/mamba_mixer.h's.
// A heterogeneous layer (ModelConfig::hetero) registers its own query groups' linear_qkv and FFN
// size's fc1/fc2; a no-op sub-block registers nothing (its norm included), a linear replacement
// its norm (input_layernorm / pre_mlp_layernorm) and self_attention.weight / mlp.weight [H, H]
// (and .bias), Megatron's local-spec names.
LayerParamIds register_layer_params(ParamBuffer& pb, const ModelConfig& c, const ModelPartition& part, int64_t layer);

struct MhcLayerSaved;  // model/mhc_layer.h

// Tensors saved by forward for backward (one layer, one micro-batch). norm1_out, norm2_out and act
// stay undefined in layers where config.recompute says so; backward recomputes them. With
// --recompute-modules mlp (dense layers) fc1_out, act, norm2_out and the fc1/fc2 LoRA rows stay
// undefined too and mlp_in is kept; with moe, moe and shared stay empty and mlp_in is kept; with
// shared_experts, shared stays empty (and mlp_in, the same tensor as moe.x, is kept).
struct LayerSaved {
  Tensor x_in;         // [Tl, H]
  Tensor norm1_stats;  // [2, Tl] LayerNorm (mean, rstd) or [1, Tl] RMSNorm (rstd)
  Tensor norm1_out;    // [T, H] (--use-ascend-mc2: this rank's rows [Tl, H], gathered again in backward)
  CoreAttentionSaved attention;  // qkv after RoPE, lse, and what the context-parallel path keeps
  Tensor q_pre, k_pre;      // --qk-layernorm: the q/k heads before their norm, [T·NHl, HD] and [T·KVl, HD]
  Tensor q_stats, k_stats;  // their norm statistics (as norm1_stats, one column per head row)
  MlaSaved mla;        // --multi-latent-attention: its own inputs and attention state (norm1_out unused)
  Tensor ctx;          // [T, NHl·HD], attention's output (bf16 when it is a bf16 GEMM's input)
  Tensor gate, ctx_ungated;  // --attention-output-gate: [T, NHl·HD] the gate before σ, attention's own output
  Tensor heads_out;    // --tp-2d (model/tp2d_layer.h): attention's output on its head split [T, NHa·HD]
  // --post-norm: the post norms' inputs (linear_proj's / linear_fc2's output before the bias, [Tl, H])
  // and their statistics
  Tensor post_attn_in, post_attn_stats, post_mlp_in, post_mlp_stats;
  Tensor x_mid;        // [Tl, H]
  Tensor norm2_stats;  // like norm1_stats
  Tensor norm2_out;    // like norm1_out
  Tensor mlp_in;       // --recompute-modules mlp / moe / shared_experts: [Tl, H] norm2's output as the
                       // MLP takes it (GEMM input type, before the SP all-gather); undefined with layernorm
                       // recompute in a dense layer (recomputed from x_mid)
  Tensor fc1_out;      // [T, Fl or 2·Fl], bias included (the activation's input)
  Tensor act;          // [T, Fl]
  MoeSaved moe;        // MoE layers: the router's and experts' state (fc1_out and act stay undefined)
  std::vector<double> moe_global_aux_counts;  // --recompute-modules moe with global_aux_loss: the n̄ [E]
                                              // forward used, for the rerun (MoeRouterKey)
  SharedExpertSaved shared;  // MoE layers with a shared expert
  Tensor lora_qkv_u, lora_proj_u, lora_fc1_u, lora_fc2_u;  // x·Aᵀ [T, r] of each adapted linear
  MambaLayerSaved mamba;  // a Mamba layer's state (every other field stays undefined)
  GdnSaved gdn;           // a GDN layer's mixer state (instead of attention, ctx and the qkv/proj inputs)
  // --enable-mhc-connections: the modules' state and the MLP half's LayerSaved (this one holds the
  // attention half's; model/mhc_layer.h)
  std::shared_ptr<MhcLayerSaved> mhc;
};

// Returns x_out [Tl, H]. With `saved` null (evaluation) nothing is kept.
Tensor transformer_layer_forward(const LayerRuntime& rt, const ParamBuffer& pb, const LayerParamIds& w, int64_t layer,
                                 const Tensor& x_in, LayerSaved* saved);
// Returns d_x_in [Tl, H]; accumulates parameter gradients into pb's gradient buffer. Releases
// the saved tensors as it goes.
Tensor transformer_layer_backward(const LayerRuntime& rt, ParamBuffer& pb, const LayerParamIds& w, int64_t layer,
                                  LayerSaved& saved, const Tensor& d_out);

// Dropout stream of a site inside a layer (site: 0 attention probabilities, 1 attention output,
// 2 MLP output; the embedding uses layer = -1).
uint64_t dropout_stream(uint64_t seed, int64_t layer, int site);

}  // namespace gale
