// Allocation of a KvCache for a model chunk.
#include "model/kv_cache.h"

#include "model/layer_shares.h"

namespace gale {

KvCache make_kv_cache(const ModelConfig& c, const ModelPartition& part, int64_t B, int64_t max_length) {
  KvCache cache;
  cache.B = B;
  cache.max_length = max_length;
  const int64_t KVl = layer_shares(c, part).groups;
  for (int64_t i = 0; i < part.num_layers; ++i)
    cache.layers.push_back(c.is_noop_layer(part.first_layer + i) ? Tensor()
                                                                   : Tensor::empty({max_length * B, 2 * KVl * c.attention_head_dim()}));
  return cache;
}

}  // namespace gale
