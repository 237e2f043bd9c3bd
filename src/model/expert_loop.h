// The MoE layer's loop over its local experts, one expert per thread (shared with the deferred
// weight gradients of --dualpipev-dw-detach, which must run each expert's GEMM as it would have).
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/threads.h"

namespace gale {

// Calls fn(e) for every expert. The experts run concurrently, one per thread (dynamic schedule:
// they get different token counts), and each expert's GEMMs and kernels then run on its one thread
// (OpenMP does not nest; oneDNN runs sequentially inside a parallel region). Splitting every small
// per-expert GEMM over all threads instead left the threads waiting at the end of each region:
// 2 threads ran 2-4x slower than 1 (docs/model.md). fn must only write what belongs to expert e.
template <class Fn>
void for_each_expert(int64_t E, Fn&& fn) {
  const int threads = static_cast<int>(std::min<int64_t>(num_threads(), E));
  if (threads <= 1) {
    for (int64_t e = 0; e < E; ++e) fn(e);
    return;
  }
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
  for (int64_t e = 0; e < E; ++e) fn(e);
}

}  // namespace gale
