// Keys and values of the positions a model has already seen, for incremental decoding (generation).
//
// With a cache, GPTModel::forward_logits runs only the new tokens: each layer appends their keys and
// values (after RoPE) to its cache rows and attends the new queries, at their global positions, to
// every cached position (causal; with a sliding window only the last W positions, by position:
// the cache keeps every row). Generating n tokens then costs O(n) layer rows instead of the
// O(n²) of rerunning the whole sequence each step; the logits are those of the whole-sequence
// forward (tests/model/kv_cache_test.cc).
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"

namespace gale {

struct KvCache {
  int64_t B = 0;           // samples (fixed for the cache's life)
  int64_t max_length = 0;  // positions it can hold
  int64_t length = 0;      // positions [0, length) are filled
  // Per layer of the model chunk (local index): [max_length·B, 2·KVl·HD] rows s·B + b, the KVl key
  // heads then the KVl value heads (context_key_layout / context_value_layout); empty for noop layers.
  // With MLA: every head's expanded key and value at the padded width, [max_length·B, 2·NHl·D]
  // (ModelConfig::attention_kv_heads / attention_head_dim; model/mla_attention.h), not the latent.
  std::vector<Tensor> layers;
};

// An empty cache for `part`'s layers of `config` (this TP rank's KV heads).
KvCache make_kv_cache(const ModelConfig& config, const ModelPartition& part, int64_t B, int64_t max_length);

}  // namespace gale
