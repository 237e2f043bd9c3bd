// How ring attention runs: MindSpeed's double ring (--cp-window-size) and its key/value cache (--context-parallel-kv-cache-policy).
#pragma once

#include <cstdint>

namespace gale {

// --context-parallel-kv-cache-policy: what forward keeps of the key/value blocks it received, so
// that backward does not receive them again. kFull keeps keys and values (backward sends only
// gradients), kHalf only the keys (backward passes the values around the ring again).
enum class RingKvCache { kNone, kFull, kHalf };

struct RingOptions {
  // --cp-window-size W: an inner ring of W consecutive ranks of the ring group and an outer ring
  // across the windows (LoongTrain's double ring); 1 (or the ring size) is the single ring.
  int64_t window = 1;
  RingKvCache cache = RingKvCache::kNone;
};

// The policy of global layer `layer` (0-based) under --context-parallel-cache-interval k: every
// layer with k = 0, else layers 0, k + 1, 2(k + 1), ... (MindSpeed's 1-based layer_number with
// layer_number % (k + 1) == 1); the others keep nothing.
inline RingKvCache ring_kv_cache_of_layer(RingKvCache policy, int64_t interval, int64_t layer) {
  return interval == 0 || layer % (interval + 1) == 0 ? policy : RingKvCache::kNone;
}

}  // namespace gale
