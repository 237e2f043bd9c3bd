// Multi-latent attention (Megatron-Core --multi-latent-attention, DeepSeek-V2/V3): forward and backward.
//
// Sizes: NH heads (NHl = NH/TP on this rank), Dn = --qk-head-dim, R = --qk-pos-emb-head-dim,
// Dq = Dn + R, Dv = --v-head-dim, Cq = --q-lora-rank (0: none), Ckv = --kv-lora-rank; T = S·B
// tokens of the micro-batch, Tl = T/TP under sequence parallelism (else T). Per layer:
//
//   x [Tl, H] (input_layernorm's output, this rank's tokens)
//   queries:  Cq > 0: linear_q_down_proj (replicated) [Tl, Cq] -> q norm -> (SP all-gather) [T, Cq]
//                     -> linear_q_up_proj (column-parallel over heads) [T, NHl·Dq]
//             Cq = 0: [q norm on x] -> (SP all-gather) [T, H] -> linear_q_proj (column-parallel) [T, NHl·Dq]
//   keys/values: linear_kv_down_proj (replicated) [Tl, Ckv + R] = [latent | k_pos_emb]
//             -> kv norm on the latent -> (SP all-gather of both) [T, Ckv + R]
//             -> linear_kv_up_proj on the latent (column-parallel) [T, NHl·(Dn + Dv)]
//   each head h: q_h = [q_nope_h (Dn) | rope(q_pe_h) (R)], k_h = [k_nope_h | rope(k_pe)] with ONE
//             k_pe per token shared by all heads, v_h (Dv); softmax scale 1/sqrt(Dq) (times YaRN's
//             m(s, mscale_all_dim)², model/yarn_rope.h)
//   attention [T, NHl·Dv] -> linear_proj (row-parallel, in the layer: model/transformer_layer.h)
//
// The q/kv norms exist with --qk-layernorm (Megatron's MLA spec: without it the latents go
// straight to the up projections); they are --normalization (RMSNorm or LayerNorm) over the latent
// width, with Megatron's fused names linear_q_up_proj.layer_norm_weight and
// linear_kv_up_proj.layer_norm_weight (and .layer_norm_bias with LayerNorm). Without a query
// latent the q norm is over x itself (H wide), fused into linear_q_proj (linear_q_proj.layer_norm_weight).
//
// RoPE on the R-wide parts uses Megatron's MLA layout (mla_rotary_interleaved, DeepSeek's
// rope_interleave): the input's even dimensions then its odd ones, rotated as "rotate half" with
// θ_i = p·base^(−2i/R). The permutation is applied to q_pe and k_pe alike, so q·k is that of the
// interleaved (pairs 2i, 2i+1) rotation; the attention output does not depend on it. The tables
// are rt.rope: plain RoPE or YaRN (model/yarn_rope.h).
//
// DeepSeek sparse attention (--experimental-attention-variant dsa, c.dsa): the lightning indexer
// (model/dsa_indexer.h) runs on the detached x and query latent and picks each query's top-k keys;
// attention then runs over the same padded packed rows with OpTable::dsa_sparse_attention_* (only
// the selected keys; no CP, TP or dropout). In training forwards the indexer loss is computed
// against these rows' dense attention and added to rt.dsa_indexer_loss; backward adds its gradient
// (scaled by rt.moe_aux_scale) to the indexer's parameters only. Decoding with a KV cache: the new
// positions' keys and values join the layer's cache, their indexer keys the cache's indexer keys
// (model/kv_cache.h), each new query picks its top-k among all cached positions up to its own
// (dsa_indexer_decode) and attends to those rows of the cache. Ragged (batched engine) decoding:
// the same per request, over its blocks (ragged_store_kv, dsa_indexer_ragged).
//
// Attention runs on the existing kernels (reference or flash, with the layer's masks, dropout and
// KV cache) with KV = NH (every head its own key and value) at one head width D = max(Dq, Dv): the
// shorter of q/k and v is zero-padded to D and the padded output columns are dropped. Zero
// columns add nothing to q·k or to the output, so the result is exact (and their gradients are
// dropped); the cost is the padding's share of the attention FLOPs.
//
// Tensor parallelism: the up projections are split over heads; the down projections and the q/kv
// norms are replicated. The gradient of the up projections' input (latent and k_pos_emb) is a
// partial sum over this rank's heads and is reduced (all-reduce, or reduce-scatter under SP)
// before the norms and down projections, which then see the whole gradient of their own tokens:
// without SP every TP rank computes the same weight gradient, with SP each rank that of its Tl
// tokens, marked sequence_parallel so the trainer sums them over TP (docs/parallelism.md).
//
// --recompute-modules mla_up_proj (config.recompute.mla_up_proj, Megatron's output-discarding
// checkpoint of the up projections and RoPE): once attention has run, the packed q/k/v rows
// [T, NHl·3D] are dropped (the rotated k_pe [T, R] is kept); backward reruns the q and kv up
// projections on the kept inputs, the packing and the queries' RoPE (same kernels, same values)
// before attention's backward. Under a Ulysses head split that includes its all-to-all again.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"
#include "model/core_attention.h"
#include "model/dsa_indexer.h"
#include "model/layer_runtime.h"
#include "model/mla_down_proj.h"
#include "model/params.h"

namespace gale {

// Ids of one layer's MLA parameters (-1 when the configuration has no such parameter). linear_proj
// is the layer's (LayerParamIds::proj_w).
struct MlaParamIds {
  int q_proj = -1;                       // Cq = 0: [NH·Dq, H], split over heads
  int q_down = -1, q_up = -1;            // Cq > 0: [Cq, H] replicated; [NH·Dq, Cq] split over heads
  int q_norm_w = -1, q_norm_b = -1;      // --qk-layernorm: [Cq], or [H] (linear_q_proj's) with Cq = 0
  int kv_down = -1, kv_up = -1;          // [Ckv + R, H] replicated; [NH·(Dn + Dv), Ckv] split over heads
  int kv_norm_w = -1, kv_norm_b = -1;    // --qk-layernorm: [Ckv]
  DsaIndexerIds indexer;                 // --experimental-attention-variant dsa (model/dsa_indexer.h)
  int softmax_offset = -1;               // --softmax-type learnable: core_attention.softmax_offset [NH], split over heads
  // --mla-down-proj-fusion (model/mla_down_proj.h): the layer's input norm (input_layernorm.weight,
  // .bias with LayerNorm), which MLA then applies itself, fused with the down projections.
  int input_norm_w = -1, input_norm_b = -1;
  bool defined() const { return kv_down >= 0; }
  bool fused_down() const { return input_norm_w >= 0; }
  MlaDownProjIds down_proj_ids() const { return MlaDownProjIds{input_norm_w, input_norm_b, q_down, kv_down}; }
  std::vector<int> all() const;  // every defined id, in registration order
};

// Whether this layer's MLA runs the fused input norm + down projections: the ids are set
// (c.mla.down_proj_fusion) and the feature installed it (OpTable::mla_down_proj_fusion).
inline bool mla_down_proj_fused(const LayerRuntime& rt, const MlaParamIds& w) {
  return w.fused_down() && rt.ops->mla_down_proj_fusion;
}

// Registers global layer `layer`'s MLA projections and norms (Megatron names, TP splits, init). With
// c.mla.down_proj_fusion, kv_down is registered right after q_down (adjacent in the flat buffers);
// the caller sets input_norm_w / input_norm_b to the layer's input norm.
MlaParamIds register_mla_params(ParamBuffer& pb, const ModelConfig& c, const ModelPartition& part, int64_t layer);

// What forward keeps for backward (one layer, one micro-batch).
struct MlaSaved {
  Tensor x;          // [Tl, H] the down projections' input (GEMM input type)
  MlaDownProjSaved down;  // --mla-down-proj-fusion: the fused norm + down projection's state
  Tensor x_full;     // Cq = 0: [T, H] linear_q_proj's input (SP-gathered x)
  Tensor q_latent;   // with the q norm: [Tl, Cq] (or [Tl, H] with Cq = 0) the norm's input (f32)
  Tensor q_stats;    // its norm statistics
  Tensor q_in;       // Cq > 0: [T, Cq] linear_q_up_proj's input (GEMM input type)
  Tensor kv_latent;  // with the kv norm: [Tl, Ckv] the norm's input (f32)
  Tensor kv_stats;
  Tensor kv_in;      // [T, Ckv] linear_kv_up_proj's input (GEMM input type)
  CoreAttentionSaved attention;  // the padded packed QKV rows after RoPE, lse, ... (without the rows
                                 // under --recompute-modules mla_up_proj)
  Tensor k_pe;       // --recompute-modules mla_up_proj: [T, R] the shared rotary key part after RoPE, to
                     // rebuild the packed rows from q_in (x_full) and kv_in in backward
  Tensor out;        // [T, NHl·D] attention's padded output (f32)
  DsaIndexerState indexer;  // DSA: the indexer's activations and the selected keys
  Tensor dsa_lse;           // DSA: the sparse attention's log-sum-exp [B, NHl, S]
};

// x [Tl, H] (GEMM input type) -> attention output [T, NHl·Dv] (f32), the input of linear_proj. With
// mla_down_proj_fused(rt, w) (--mla-down-proj-fusion) x is the layer's input before its norm (f32) and MLA
// applies the norm, fused with the down projections (model/mla_down_proj.h). `ap`
// is the micro-batch's attention problem with this layer's dropout stream, `layer` the global layer
// index (core_attention_forward). With rt.kv_cache the new
// positions' expanded keys and values are appended to the layer's cache (`cache`); with rt.ragged_kv
// they go into each request's blocks (ragged_attention_forward); with `saved` null nothing is kept.
Tensor mla_attention_forward(const LayerRuntime& rt, const ParamBuffer& pb, const MlaParamIds& w,
                             const AttentionProblem& ap, int64_t layer, const Tensor& x, Tensor* cache,
                             MlaSaved* saved);

// Backward: d_ctx [T, NHl·Dv] -> dx [Tl, H] (whole: no further TP reduction); parameter gradients
// accumulated. With mla_down_proj_fused(rt, w) dx is the gradient of the layer's input before its norm (the
// norm's gradients accumulated too). Releases `saved`.
Tensor mla_attention_backward(const LayerRuntime& rt, ParamBuffer& pb, const MlaParamIds& w, const AttentionProblem& ap,
                              MlaSaved& saved, const Tensor& d_ctx);

}  // namespace gale
