// What one transformer layer needs to know about the current micro-batch (built once per micro-batch).
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "kernels/op_table.h"
#include "model/config.h"
#include "model/kv_cache.h"
#include "model/micro_batch.h"
#include "model/moe_layer.h"
#include "parallel/context_split.h"

namespace gale {
class WeightGradStore;  // model/weight_grad_store.h
}

namespace gale {

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
  // Incremental decoding (model/kv_cache.h): the micro-batch holds only new positions, after
  // kv_cache->length cached ones; attention appends their keys and values and reads the cache.
  KvCache* kv_cache = nullptr;
  // Ragged decoding (GPTModel::forward_logits_ragged): the micro-batch is one row sequence holding
  // several requests' new tokens; attention reads and appends each request's blocks.
  RaggedKvBatch* ragged_kv = nullptr;
  // Attention problem for this micro-batch (masks, positions, dropout), shared by all layers;
  // the per-layer dropout stream is filled in by the layer.
  AttentionProblem attention;
  // MoE layers: the auxiliary losses of training forwards that keep state for backward are added
  // here (null: not collected), and backward scales their gradients by moe_aux_scale (Megatron's
  // MoEAuxLossAutoScaler scale: the --fp16 loss scale / num_microbatches, without --fp16 1 / num_microbatches).
  MoeAuxLosses* moe_losses = nullptr;
  double moe_aux_scale = 1.0;
  // --calculate-per-token-loss: the MoE routers' scale is the --fp16 loss scale alone (Megatron's
  // forward_step sets MoEAuxLossAutoScaler to it in that mode, without 1 / num_microbatches) and each
  // router multiplies its losses by its tokens T·|TP×CP| (model/moe_router.h); moe_aux_scale keeps
  // the default mode's value for the DSA indexer loss.
  bool per_token_loss = false;
  double moe_router_aux_scale = 1.0;
  // DSA layers (--experimental-attention-variant dsa): the same forwards add their indexer loss
  // (coefficient included) here (null: not collected); backward scales its gradient by moe_aux_scale.
  double* dsa_indexer_loss = nullptr;
  // MoE layers with --moe-router-enable-expert-bias: the same forwards add the tokens each expert
  // kept (global layer -> [E]) here (null: not counted).
  std::map<int64_t, std::vector<int64_t>>* moe_token_counts = nullptr;
  // --qk-clip / --log-max-attention-logit (config->track_max_attention_logit): every forward's core
  // attention (training and evaluation alike, as Transformer Engine's return_max_logit) merges each
  // of its heads' largest pre-softmax logit into (*max_attention_logits)[global layer] [NHl] (this
  // TP rank's heads, -inf until seen; model/qk_clip.h). Null: not tracked.
  std::map<int64_t, std::vector<float>>* max_attention_logits = nullptr;
  // Backward under --dualpipev-dw-detach (GPTModel::backward's `defer_weight_grads`): the dense
  // transformer layers' linear weight gradients are queued here instead of computed (null: at once).
  WeightGradStore* weight_grads = nullptr;
  // --enable-mhc-connections (model/mhc_layer.h): 0 the whole layer; 1 only its attention half, 2
  // only its MLP half, each returning its sub-block's output with the bias added, without dropout or
  // residual (the hyper-connection module around it does both).
  int mhc_half = 0;
};

}  // namespace gale
