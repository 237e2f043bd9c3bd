// Allocation of a KvCache for a model chunk.
#include "model/kv_cache.h"

#include "model/layer_shares.h"

#include "core/check.h"

namespace gale {

bool layer_keeps_kv(const ModelConfig& c, int64_t layer) {
  if (c.is_noop_layer(layer)) return false;
  if (c.hybrid.enabled) return c.hybrid.kind(layer) == '*' || c.hybrid.kind(layer) == '+';  // attention or MLA
  if (c.gdn.is_gdn_layer(layer)) return false;  // its decoding state instead (model/mamba_state.h)
  return c.attention_kind(layer) == SubBlock::kBlock;  // heterogeneous layers: none for no-op or linear
}

KvCache make_kv_cache(const ModelConfig& c, const ModelPartition& part, int64_t B, int64_t max_length) {
  KvCache cache;
  cache.B = B;
  cache.max_length = max_length;
  for (int64_t i = 0; i < part.num_layers; ++i) {
    const int64_t layer = part.first_layer + i;  // heterogeneous layers: each its own query groups
    const int64_t KVl = layer_shares(c.for_layer(layer), part).groups;
    cache.layers.push_back(layer_keeps_kv(c, layer) ? Tensor::empty({max_length * B, 2 * KVl * c.attention_head_dim()})
                                                    : Tensor());
    if (c.dsa.enabled)
      cache.indexer_keys.push_back(layer_keeps_kv(c, layer) ? Tensor::empty({max_length * B, c.dsa.head_dim}) : Tensor());
  }
  if (c.hybrid.enabled || c.gdn.enabled) {
    cache.mamba = MambaStatePool(c, part, B);
    for (int64_t b = 0; b < B; ++b) cache.mamba.allocate();  // slot b: sample b, zero
  }
  return cache;
}

KvCache clone_kv_cache(const KvCache& src) {
  KvCache dst = src;
  const int64_t rows = src.length * src.B;
  for (std::vector<Tensor>* per_layer : {&dst.layers, &dst.indexer_keys})
    for (Tensor& t : *per_layer) {
      if (!t.defined()) continue;
      const Tensor from = t;
      t = Tensor::empty(from.shape(), from.dtype());
      if (rows > 0) t.slice(0, rows).copy_from(from.slice(0, rows));
    }
  dst.mamba = src.mamba.clone();
  return dst;
}

std::vector<RecurrentRows> recurrent_decoding_rows(KvCache* cache, RaggedKvBatch* ragged, int64_t B, int64_t S,
                                                   int64_t local) {
  std::vector<RecurrentRows> rows;
  if (ragged) {
    MambaStatePool* pool = ragged->mamba;
    GALE_CHECK(pool) << "ragged decoding of a model with Mamba or GDN layers without state slots "
                        "(RaggedKvBatch::mamba)";
    int64_t row = 0;
    for (const RaggedRequest& r : ragged->requests) {
      RecurrentRows rr{row, 1, r.rows, pool->conv(local, r.mamba_slot), pool->ssm(local, r.mamba_slot)};
      if (r.keep_steps) {
        GALE_CHECK(r.rows <= pool->steps()) << "ragged decoding: " << r.rows << " rows keep their states, the slots have "
                                            << pool->steps() << " step buffers";
        rr.conv_steps = pool->conv_step(local, r.mamba_slot, 0);
        rr.ssm_steps = pool->ssm_step(local, r.mamba_slot, 0);
      }
      rows.push_back(rr);
      row += r.rows;
    }
  } else if (cache) {
    GALE_CHECK(cache->mamba.slots() == B) << "kv cache of a model with Mamba or GDN layers: " << cache->mamba.slots()
                                          << " state slots for " << B << " samples";
    for (int64_t b = 0; b < B; ++b)
      rows.push_back(RecurrentRows{b, B, S, cache->mamba.conv(local, b), cache->mamba.ssm(local, b)});
  }
  return rows;
}

KvBlockPool::KvBlockPool(const ModelConfig& c, const ModelPartition& part, int64_t block_tokens, int64_t num_blocks)
    : block_tokens_(block_tokens), num_blocks_(num_blocks) {
  GALE_CHECK(block_tokens > 0 && num_blocks > 0) << "kv block pool of " << num_blocks << " blocks of " << block_tokens;
  width_ = 2 * layer_shares(c, part).groups * c.attention_head_dim();
  for (int64_t i = 0; i < part.num_layers; ++i)
    GALE_CHECK(!c.layer_differs(part.first_layer + i) && c.attention_kind(part.first_layer + i) == SubBlock::kBlock)
        << "ragged decoding with heterogeneous layers (--heterogeneous-layers-config-*): not supported yet (layer "
        << part.first_layer + i << " has its own attention)";
  for (int64_t i = 0; i < part.num_layers; ++i) {
    if (!layer_keeps_kv(c, part.first_layer + i)) {
      slot_.push_back(-1);
      continue;
    }
    slot_.push_back(static_cast<int64_t>(storage_.size()));
    storage_.push_back(Tensor::empty({num_blocks * block_tokens, width_}));
    if (c.dsa.enabled) indexer_storage_.push_back(Tensor::empty({num_blocks * block_tokens, c.dsa.head_dim}));
  }
  indexer_width_ = c.dsa.enabled ? c.dsa.head_dim : 0;
  block_bytes_ = static_cast<int64_t>(storage_.size()) * block_tokens * (width_ + indexer_width_) *
                 static_cast<int64_t>(sizeof(float));
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
  taken_.assign(static_cast<size_t>(num_blocks), 0);
}

std::vector<int32_t> KvBlockPool::allocate(int64_t n) {
  GALE_CHECK(n <= free_blocks()) << "kv block pool: " << n << " blocks asked, " << free_blocks() << " free";
  std::vector<int32_t> out;
  for (int64_t i = 0; i < n; ++i) {
    out.push_back(free_.back());
    free_.pop_back();
    taken_[static_cast<size_t>(out.back())] = 1;
  }
  return out;
}

void KvBlockPool::release(const std::vector<int32_t>& blocks) {
  for (int32_t b : blocks) {
    GALE_CHECK(b >= 0 && b < num_blocks_ && taken_[static_cast<size_t>(b)]) << "kv block pool: block " << b
                                                                            << " released but not allocated";
    taken_[static_cast<size_t>(b)] = 0;
    free_.push_back(b);
  }
}

float* KvBlockPool::rows(int64_t layer, int32_t id) {
  const int64_t s = slot_.at(static_cast<size_t>(layer));
  GALE_CHECK(s >= 0 && id >= 0 && id < num_blocks_) << "kv block pool: layer " << layer << ", block " << id;
  return storage_[static_cast<size_t>(s)].data<float>() + static_cast<int64_t>(id) * block_tokens_ * width_;
}

float* KvBlockPool::indexer_rows(int64_t layer, int32_t id) {
  const int64_t s = slot_.at(static_cast<size_t>(layer));
  GALE_CHECK(indexer_width_ > 0 && s >= 0 && id >= 0 && id < num_blocks_)
      << "kv block pool: indexer keys of layer " << layer << ", block " << id;
  return indexer_storage_[static_cast<size_t>(s)].data<float>() +
         static_cast<int64_t>(id) * block_tokens_ * indexer_width_;
}

}  // namespace gale
