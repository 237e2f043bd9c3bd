// One pre-norm transformer layer (attention + MLP) with explicit forward and backward.
//
// Shapes (T = S·B tokens, Tl = T/TP with sequence parallelism else T; NHl, KVl, Fl = this TP
// rank's heads, KV heads and FFN columns):
//   x_in [Tl, H] -> norm1 -> (SP all-gather) [T, H] -> linear_qkv [T, (NHl+2KVl)·HD] -> RoPE
//   -> attention [T, NHl·HD] -> linear_proj (row-parallel, all-reduce / SP reduce-scatter) [Tl, H]
//   -> x_mid = x_in + dropout(. + b_proj) -> norm2 -> (SP all-gather) -> linear_fc1 [T, Fl or 2Fl]
//   -> GeLU / SwiGLU [T, Fl] -> linear_fc2 (row-parallel) [Tl, H] -> x_out = x_mid + dropout(. + b_fc2)
// With context parallelism T = S·B counts this cp rank's positions only; attention either
// all-gathers the keys and values of the whole sequence (megatron_cp_algo) or runs on whole
// sequences for 1/CP of the heads between two all-to-alls (ulysses_cp_algo), model/context_parallel.h,
// or (hybrid_cp_algo) runs ring attention over the ring sub-group on 1/U of the heads between two
// all-to-alls within the Ulysses sub-group (parallel/hybrid_cp_groups.h).
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "kernels/op_table.h"
#include "model/config.h"
#include "model/micro_batch.h"
#include "model/moe_layer.h"
#include "model/params.h"
#include "parallel/context_split.h"

namespace gale {

// Ids of one layer's parameters in the ParamBuffer (-1 when the model has no such parameter).
struct LayerParamIds {
  int norm1_w = -1, norm1_b = -1, qkv_w = -1, qkv_b = -1, proj_w = -1, proj_b = -1;
  int norm2_w = -1, norm2_b = -1, fc1_w = -1, fc1_b = -1, fc2_w = -1, fc2_b = -1;
  MoeParamIds moe;  // a MoE layer (config.moe.is_moe_layer): router and experts instead of fc1/fc2
  std::vector<int> all() const;  // every id of the layer, in registration order
};

// Registers the parameters of global layer `layer` (its MLP a MoE MLP where config.moe says so) with their Megatron names, TP splits and init.
LayerParamIds register_layer_params(ParamBuffer& pb, const ModelConfig& c, const ModelPartition& part, int64_t layer);

// Everything a layer needs about the current micro-batch, built once per micro-batch.
struct LayerRuntime {
  const ModelConfig* config = nullptr;
  const ModelPartition* part = nullptr;
  const OpTable* ops = nullptr;
  const RopeTables* rope = nullptr;  // null without RoPE
  const MicroBatch* mb = nullptr;
  bool training = true;
  // Global id (sample·S_global + global position) of each local row t = s·B + b of [Tl, H]
  // activations, for hidden dropout.
  std::vector<int64_t> hidden_row_ids;
  // This rank's positions of the sequence (context parallelism; cp_size 1 without it). With
  // cp_size > 1 attention gathers keys and values over part->cp, or with part->cp_ulysses trades
  // the sequence split for a head split (model/context_parallel.h).
  ContextSplit cp_split;
  // hybrid_cp_algo (parallel/hybrid_cp_groups.h, part->hybrid_cp()): the split of the Ulysses
  // all-to-all (the ring block of S_global/R positions over U ranks) and of the ring (S_global over
  // R ranks); the block's global positions in its local order [S_global/R] and, with document ids,
  // their ids [B, S_global/R] (the queries' after the all-to-all).
  ContextSplit hybrid_ulysses_split, hybrid_ring_split;
  std::vector<int32_t> hybrid_positions, hybrid_q_doc_ids;
  // RoPE positions [B, S]: the token's global index in the sequence, as Megatron-Core applies
  // rotary embeddings (position_ids, restarted by --reset-position-ids, feed only the learned
  // absolute position embedding). Within one document attention depends only on position
  // differences, so with --reset-attention-mask the choice does not change the result.
  std::vector<int32_t> rope_positions;
  // Attention problem for this micro-batch (masks, positions, dropout), shared by all layers;
  // the per-layer dropout stream is filled in by the layer.
  AttentionProblem attention;
  // MoE layers: the auxiliary losses of training forwards that keep state for backward are added
  // here (null: not collected), and backward scales their gradients by moe_aux_scale (Megatron's
  // MoEAuxLossAutoScaler scale, 1 / num_microbatches).
  MoeAuxLosses* moe_losses = nullptr;
  double moe_aux_scale = 1.0;
};

// Tensors saved by forward for backward (one layer, one micro-batch). norm1_out, norm2_out and act
// stay undefined in layers where config.recompute says so; backward recomputes them.
struct LayerSaved {
  Tensor x_in;         // [Tl, H]
  Tensor norm1_stats;  // [2, Tl] LayerNorm (mean, rstd) or [1, Tl] RMSNorm (rstd)
  Tensor norm1_out;    // [T, H]
  Tensor qkv;          // [T, (NHl + 2·KVl)·HD], after RoPE (Ulysses: [S_global·B, (NHl + 2·KVl)·HD/CP];
                       // hybrid: [S_global/R·B, (NHl + 2·KVl)·HD/U])
  Tensor kv_global;    // all-gather CP: keys and values of the whole sequence [S_global·B, 2·KVl·HD]
  Tensor kv_local;     // ring CP: keys and values of this rank's positions only [S_local·B, 2·KVl·HD]
                       // (hybrid: of the ring rank's block for this rank's heads [S_global/R·B, 2·KVl·HD/U])
  Tensor ctx;          // [T, NHl·HD]
  Tensor attn_out;     // Ulysses: attention's output for this rank's heads [S_global·B, NHl·HD/CP]
                       // (hybrid: [S_global/R·B, NHl·HD/U], lse [B, NHl/U, S_global/R])
  Tensor lse;          // [B, NHl, S] (Ulysses: [B, NHl/CP, S_global])
  Tensor x_mid;        // [Tl, H]
  Tensor norm2_stats;  // like norm1_stats
  Tensor norm2_out;    // [T, H]
  Tensor fc1_out;      // [T, Fl or 2·Fl], bias included (the activation's input)
  Tensor act;          // [T, Fl]
  MoeSaved moe;        // MoE layers: the router's and experts' state (fc1_out and act stay undefined)
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
