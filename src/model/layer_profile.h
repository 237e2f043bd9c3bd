// Per-layer costs of training forwards and backwards, measured inside GPTModel for MindSpeed's
// --automated-pipeline (train/automated_pipeline.h): wall time and the bytes a forward leaves alive.
#pragma once

#include <cstdint>
#include <map>

namespace gale {

// Sums over the recorded micro-batches of one piece of the model: a transformer layer (its global
// index), the embedding (kEmbedding) or the head: final norm, output layer and loss (kHead).
struct LayerCost {
  double forward_seconds = 0.0;
  double backward_seconds = 0.0;
  // host_allocator().current_bytes() after the forward minus before: what the micro-batch's
  // forward of this piece leaves alive until its backward (its saved activations and its output,
  // less its input when nothing keeps it) — exact, from the allocator's byte accounting.
  int64_t kept_bytes = 0;
  // Bytes of the piece's input activation (a layer's [Tl, H]): what full recomputation keeps.
  int64_t input_bytes = 0;
  int64_t forwards = 0, backwards = 0;
};

// What GPTModel::set_layer_profiler records into while `recording` is true: training forwards
// (not recompute reruns) and backwards, one entry per piece, summed over micro-batches.
struct LayerProfiler {
  static constexpr int64_t kEmbedding = -1;
  static constexpr int64_t kHead = -2;
  bool recording = false;
  std::map<int64_t, LayerCost> costs;
};

}  // namespace gale
