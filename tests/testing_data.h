// A deterministic synthetic SampleDataset for training tests (no files needed).
#pragma once

#include <cstdint>

#include "core/rng.h"
#include "train/sample_dataset.h"

namespace gale::testing {

// Sample k: a walk through the vocabulary where token t is mostly followed by t + 1, so the loss
// falls within a few steps; every token has loss; positions 0..S-1; a new document starts at
// about one position in six (document ids, used only with --reset-attention-mask).
class SyntheticDataset : public SampleDataset {
 public:
  SyntheticDataset(int64_t size, int64_t S, int64_t vocab) : size_(size), S_(S), vocab_(vocab) {}
  int64_t size() const override { return size_; }
  Status get(int64_t index, TrainingSample* out) const override {
    out->tokens.resize(S_);
    out->labels.resize(S_);
    out->loss_mask.assign(S_, 1.0f);
    out->position_ids.resize(S_);
    out->document_ids.assign(S_, 0);
    for (int64_t s = 1; s < S_; ++s)
      out->document_ids[s] = out->document_ids[s - 1] + (uniform_at(7, 3, static_cast<uint64_t>(index * S_ + s)) < 0.17f);
    int32_t t = static_cast<int32_t>(uniform_at(7, 1, static_cast<uint64_t>(index)) * vocab_);
    for (int64_t s = 0; s < S_; ++s) {
      out->tokens[s] = t;
      t = static_cast<int32_t>((t + 1 + (uniform_at(7, 2, static_cast<uint64_t>(index * S_ + s)) < 0.2f)) % vocab_);
      out->labels[s] = t;
      out->position_ids[s] = static_cast<int32_t>(s);
    }
    return Status::Ok();
  }

 private:
  int64_t size_, S_, vocab_;
};

// SyntheticDataset whose samples have loss on their last 1 + (5·index mod S) positions only (the
// earlier ones masked, as an instruction dataset's prompt), so micro-batches differ in their
// loss-token counts: the case where --calculate-per-token-loss changes the gradients.
class MaskedSyntheticDataset : public SyntheticDataset {
 public:
  MaskedSyntheticDataset(int64_t size, int64_t S, int64_t vocab) : SyntheticDataset(size, S, vocab), S_(S) {}
  Status get(int64_t index, TrainingSample* out) const override {
    GALE_RETURN_IF_ERROR(SyntheticDataset::get(index, out));
    const int64_t kept = 1 + (5 * index) % S_;
    for (int64_t s = 0; s < S_ - kept; ++s) out->loss_mask[s] = 0.0f;
    return Status::Ok();
  }

 private:
  int64_t S_;
};

}  // namespace gale::testing
