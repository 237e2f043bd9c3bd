// One micro-batch as the model consumes it, plus per-batch data the layers share.
#pragma once

#include <cstdint>
#include <vector>

namespace gale {

// B samples of S tokens. Per-token arrays are [B, S] (sample-major, as the data loader builds
// them); the model reorders tokens to its [S, B] activation layout itself.
struct MicroBatch {
  int64_t B = 0, S = 0;
  std::vector<int32_t> tokens;        // [B, S]
  std::vector<int32_t> labels;        // [B, S]
  std::vector<float> loss_mask;       // [B, S]
  std::vector<int32_t> position_ids;  // [B, S]
  std::vector<int32_t> document_ids;  // [B, S], or empty when attention is plain causal
  std::vector<int64_t> sample_ids;    // [B]: global index of each sample in the training stream (dropout streams)
};

}  // namespace gale
