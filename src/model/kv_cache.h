// Keys and values of the positions a model has already seen, for incremental decoding (generation).
//
// With a cache, GPTModel::forward_logits runs only the new tokens: each layer appends their keys and
// values (after RoPE) to its cache rows and attends the new queries, at their global positions, to
// every cached position (causal; with a sliding window only the last W positions, by position:
// the cache keeps every row). Generating n tokens then costs O(n) layer rows instead of the
// O(n²) of rerunning the whole sequence each step; the logits are those of the whole-sequence
// forward (tests/model/kv_cache_test.cc).
//
// A hybrid Mamba model (--is-hybrid-model) keeps keys and values only for its attention layers
// ('*'); its Mamba layers ('M') keep their decoding state instead (model/mamba_state.h: the
// convolution's last inputs and the scan's state, one slot per sample or request), and its MLP
// layers ('-') nothing. So do a Gated DeltaNet model's GDN layers (--experimental-attention-variant
// gdn: the convolution's last inputs and the delta rule's state); its full-attention layers keep
// keys and values.
//
// A DeepSeek sparse attention model (--experimental-attention-variant dsa, model/dsa_indexer.h)
// keeps, besides each MLA layer's keys and values, its lightning indexer's key of every cached
// position: a new query scores them all and attends to its top-k positions only.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"
#include "model/mamba_state.h"

namespace gale {

struct KvCache {
  int64_t B = 0;           // samples (fixed for the cache's life)
  int64_t max_length = 0;  // positions it can hold
  int64_t length = 0;      // positions [0, length) are filled
  // Per layer of the model chunk (local index): [max_length·B, 2·KVl·HD] rows s·B + b, the KVl key
  // heads then the KVl value heads (context_key_layout / context_value_layout); empty for noop layers.
  // With MLA: every head's expanded key and value at the padded width, [max_length·B, 2·NHl·D]
  // (ModelConfig::attention_kv_heads / attention_head_dim; model/mla_attention.h), not the latent.
  // Empty for noop layers and a hybrid model's Mamba and MLP layers (layer_keeps_kv).
  std::vector<Tensor> layers;
  // DSA models: per layer of the chunk the indexer's keys (after k_norm and RoPE), [max_length·B, DI]
  // rows s·B + b; empty for other models.
  std::vector<Tensor> indexer_keys;
  // A hybrid model's Mamba layers or a GDN model's GDN layers: slot b is sample b's state (B slots,
  // zero when made).
  MambaStatePool mamba;
  // --flash-decode: > 0 makes a one-token step of one sample attend with the split-K flash decoding
  // kernel (kernels/cpu/flash_decode.h) in chunks of this many cached positions; 0: the op table's
  // attention_forward.
  int64_t flash_decode_chunk = 0;
};

// Whether global layer `layer` attends, i.e. keeps keys and values (not a noop layer, nor a hybrid
// model's Mamba or MLP layer, nor a GDN layer).
bool layer_keeps_kv(const ModelConfig& config, int64_t layer);

// An empty cache for `part`'s layers of `config` (this TP rank's KV heads; B zero Mamba states; DSA
// indexer keys).
KvCache make_kv_cache(const ModelConfig& config, const ModelPartition& part, int64_t B, int64_t max_length);

// A cache holding `src`'s filled positions (and their DSA indexer keys) and Mamba states in storage
// of its own (a beam that branches off another continues from the same state without changing it).
KvCache clone_kv_cache(const KvCache& src);

// Paged key/value storage for many requests (Megatron's DynamicInferenceContext memory buffer):
// `num_blocks` blocks of `block_tokens` positions, allocated once; each block holds its positions'
// keys and values for every layer of the chunk (rows of 2·KVl·HD floats as in KvCache::layers), and
// for a DSA model each layer's indexer keys (rows of DI floats as in KvCache::indexer_keys).
// Requests take blocks from a free stack and give them back; the storage itself never changes size,
// so the allocator's bytes return to where they were when the pool is destroyed.
class KvBlockPool {
 public:
  KvBlockPool(const ModelConfig& config, const ModelPartition& part, int64_t block_tokens, int64_t num_blocks);

  int64_t block_tokens() const { return block_tokens_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  int64_t used_blocks() const { return num_blocks_ - free_blocks(); }
  int64_t row_width() const { return width_; }
  // Bytes of one block over all layers (the pool holds num_blocks of them).
  int64_t block_bytes() const { return block_bytes_; }
  // Takes `n` blocks off the free stack (GALE_CHECKs that there are).
  std::vector<int32_t> allocate(int64_t n);
  // Gives blocks back (each must be allocated: a double release is a GALE_CHECK failure).
  void release(const std::vector<int32_t>& blocks);
  // The [block_tokens, row_width] rows of block `id` for local layer `layer` (not a noop layer).
  float* rows(int64_t layer, int32_t id);
  // A DSA model's [block_tokens, DI] indexer keys of block `id` for local layer `layer`.
  float* indexer_rows(int64_t layer, int32_t id);

 private:
  int64_t block_tokens_, num_blocks_, width_ = 0, indexer_width_ = 0, block_bytes_ = 0;
  std::vector<int64_t> slot_;     // local layer -> storage slot (-1: no keys and values, layer_keeps_kv)
  std::vector<Tensor> storage_;   // per slot: [num_blocks·block_tokens, width]
  std::vector<Tensor> indexer_storage_;  // DSA: per slot [num_blocks·block_tokens, DI]
  std::vector<int32_t> free_;     // free block ids (a stack)
  std::vector<char> taken_;       // per block: allocated
};

// One forward over several requests' new tokens (GPTModel::forward_logits_ragged): request r's
// rows follow request r − 1's; their keys and values go to positions [cached, cached + rows) of
// the request's blocks (enough of them for cached + rows positions, in position order), and its
// queries attend (causally, at those positions) to positions [0, cached + rows) of its blocks only.
// A hybrid model's Mamba layers (a GDN model's GDN layers) run the request's rows from, and leave
// their state in, its slot `mamba_slot` of `mamba` (fresh — zero — when cached is 0). With
// `keep_steps` (speculative decoding's verification rows, at most mamba->steps() of them) they also
// leave the state after each row in the slot's step buffers (MambaStatePool::keep_step).
struct RaggedRequest {
  std::vector<int32_t> blocks;
  int64_t cached = 0;
  int64_t rows = 0;
  int64_t mamba_slot = -1;
  bool keep_steps = false;
};
struct RaggedKvBatch {
  KvBlockPool* pool = nullptr;
  MambaStatePool* mamba = nullptr;  // the Mamba or GDN layers' states (null without such layers)
  std::vector<RaggedRequest> requests;
  int64_t flash_decode_chunk = 0;  // as KvCache::flash_decode_chunk, for the requests with one new row
};

// A recurrent (Mamba or GDN) layer's sequences in an inference forward: sample b's rows b, b + B, ...
// with slot b of cache->mamba (a KvCache forward of B samples of S new positions), or request r's
// rows after request r − 1's with its mamba_slot (ragged); empty when both are null (training and
// whole-sequence forwards: every sample from the zero state). `local_layer`: the layer's index in
// the chunk.
struct RecurrentRows {
  int64_t first = 0, stride = 1, length = 0;
  float* conv = nullptr;  // MambaStatePool::conv
  float* ssm = nullptr;   // MambaStatePool::ssm
  float* conv_steps = nullptr, *ssm_steps = nullptr;  // RaggedRequest::keep_steps: MambaStatePool::conv_step / ssm_step
};
std::vector<RecurrentRows> recurrent_decoding_rows(KvCache* cache, RaggedKvBatch* ragged, int64_t B, int64_t S,
                                                   int64_t local_layer);

}  // namespace gale
