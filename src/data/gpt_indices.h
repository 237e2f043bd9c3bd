// GPTDataset's three indices (megatron.md §3.2-3.5), bit-exact with Megatron's gpt_dataset.py +
// helpers.cpp for the same sequence lengths, split range, sample count and seed.
//
// * document index: `epochs` copies of the split's sequence ids, shuffled by
//   numpy.random.RandomState(seed) (the last epoch shuffled on its own when it is "separate").
// * sample index: (total + 1) rows of (position in the document index, token offset); sample j
//   spans rows j and j+1.
// * shuffle index: a permutation of [0, total) drawn from the same RandomState (the last
//   epoch's samples permuted separately and kept at the end).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/status.h"
#include "core/mapped_file.h"

namespace gale {

struct GptIndexParams {
  int64_t seq_length = 0;    // S (--seq-length)
  int64_t num_samples = -1;  // N; -1 = exactly one epoch (Megatron's num_samples=None)
  uint32_t seed = 1234;      // --seed
  int add_extra_token = 1;   // E: Megatron's add_extra_token_to_sequence (always 1 in pretrain_gpt)
  bool drop_last = true;     // drop the last partial sample (always true in pretrain_gpt)
};

struct GptIndices {
  int64_t num_epochs = 0;
  bool separate_final_epoch = false;
  int64_t tokens_per_epoch = 0;
  std::vector<int32_t> document_index;
  std::vector<int64_t> sample_index;   // flattened (total + 1) x 2
  std::vector<int64_t> shuffle_index;  // total entries
  // Or, under --dataloader-fast-cache-load / --dataloader-defer-npy-index-mmap, the three arrays
  // as read-only maps of the cached .npy files (index_cache.h); the vectors above stay empty and
  // `maps` keeps the mappings alive.
  std::vector<std::shared_ptr<const MappedFile>> maps;
  std::span<const int32_t> mapped_document_index;
  std::span<const int64_t> mapped_sample_index, mapped_shuffle_index;

  bool mapped() const { return !maps.empty(); }
  // The arrays, wherever they live.
  std::span<const int32_t> documents() const { return mapped() ? mapped_document_index : document_index; }
  std::span<const int64_t> samples() const { return mapped() ? mapped_sample_index : sample_index; }
  std::span<const int64_t> shuffle() const { return mapped() ? mapped_shuffle_index : shuffle_index; }
  int64_t size() const { return static_cast<int64_t>(shuffle().size()); }
};

// Smallest e >= 1 with e*T >= N*S + E (1 when N is -1).
int64_t gpt_num_epochs(int64_t tokens_per_epoch, const GptIndexParams& p);

// The separate_final_epoch rule: e > 1 and (N - sans) < int(0.80 * per).
bool gpt_separate_final_epoch(int64_t num_epochs, int64_t tokens_per_epoch, const GptIndexParams& p);

// Megatron's _build_document_index over `documents` (the split's sequence ids).
std::vector<int32_t> build_document_index(std::span<const int32_t> documents, int64_t num_epochs,
                                          class NumpyRandomState& rng, bool separate_final_epoch);

// helpers.cpp build_sample_idx. `sizes` are the sequence lengths of the whole dataset.
std::vector<int64_t> build_sample_index(const UnalignedArray<int32_t>& sizes, std::span<const int32_t> document_index,
                                        int64_t seq_length, int64_t num_epochs, int64_t tokens_per_epoch,
                                        bool drop_last, int add_extra_token);

// _build_shuffle_index: permutation of [0, num_samples) then of [num_samples, total_size).
std::vector<int64_t> build_shuffle_index(int64_t num_samples, int64_t total_size, class NumpyRandomState& rng);

// All three for the split [begin, end) of the sequences whose lengths are `sizes`. Errors (with
// `name` in the message) when the split has no tokens (where Megatron loops forever) or when
// the parameters are invalid.
StatusOr<GptIndices> build_gpt_indices(const UnalignedArray<int32_t>& sizes, int64_t begin, int64_t end,
                                       const GptIndexParams& p, const std::string& name);

}  // namespace gale
