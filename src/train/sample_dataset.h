// What the trainer reads: samples of S tokens with labels, loss mask, positions and documents.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"

namespace gale {

// One training sample as the model consumes it (all vectors have S = --seq-length entries).
struct TrainingSample {
  std::vector<int32_t> tokens;        // input ids
  std::vector<int32_t> labels;        // next-token ids
  std::vector<float> loss_mask;       // 0 at pads, and at EOD with --eod-mask-loss
  std::vector<int32_t> position_ids;  // arange(S), restarted after each EOD with --reset-position-ids
  std::vector<int32_t> document_ids;  // per token: index of its document inside the sample (0, 1, ...),
                                      // incremented after each EOD; all 0 unless --reset-attention-mask.
                                      // Attention is allowed only between tokens with equal ids.
};

// One split (train, valid or test), possibly a blend. Sample k is Megatron's k-th sample.
class SampleDataset {
 public:
  virtual ~SampleDataset() = default;
  virtual int64_t size() const = 0;
  virtual Status get(int64_t index, TrainingSample* out) const = 0;  // thread-safe
};

}  // namespace gale
