// --data-cache-path: GPTDataset indices saved as .npy files and reused by later runs.
//
// Files are "<hash>-GPTDataset-<split>-{description.txt,document_index.npy,sample_index.npy,
// shuffle_index.npy}" (Megatron's naming; the hash is Gale's own, of the description text, so the
// files are not interchangeable with Megatron's). A cached entry is used only when its
// description matches exactly and its arrays are consistent with the dataset; anything else is
// rebuilt. Writes are atomic (temporary file + rename), so ranks sharing the directory are safe.
#pragma once

#include <string>

#include "core/status.h"
#include "data/gpt_indices.h"
#include "core/mapped_file.h"
#include "data/split.h"

namespace gale {

struct GptCacheKey {
  std::string path;         // the dataset prefix
  std::string fingerprint;  // TokenSource::fingerprint()
  DataSplit split;
  int64_t begin, end;
  GptIndexParams params;
  std::string split_text;  // --split as given
};

std::string gpt_cache_description(const GptCacheKey& key);
// "<dir>/<hash>-GPTDataset-<split>-" (append the affix).
std::string gpt_cache_base(const std::string& dir, const GptCacheKey& key);

// NotFound when there is no entry; DataLoss (and a warning) when it is inconsistent.
StatusOr<GptIndices> load_cached_gpt_indices(const std::string& dir, const GptCacheKey& key,
                                             const UnalignedArray<int32_t>& sizes);
// --dataloader-fast-cache-load / --dataloader-defer-npy-index-mmap (Megatron-LM main): the entry's
// three .npy files mapped read-only (data/npy.h map_npy; GptIndices::mapped), as they are, trusted: description.txt is not read and the arrays are not checked
// against the sequence lengths, only their shapes (the samples' reads check their own bounds).
// A missing or unreadable file is FailedPrecondition naming --data-cache-path, `flag` and the file
// (never a rebuild). tokens_per_epoch and num_epochs come from `sizes` and the key.
StatusOr<GptIndices> load_trusted_gpt_indices(const std::string& dir, const GptCacheKey& key,
                                              const UnalignedArray<int32_t>& sizes, const std::string& flag);
// The number of samples the entry holds, from the sequence lengths alone (Megatron's
// GPTDataset.__len__ under --dataloader-defer-npy-index-mmap): (epochs·T − E) / S, rounded up
// without drop_last.
int64_t gpt_cached_sample_count(const GptCacheKey& key, const UnalignedArray<int32_t>& sizes);
Status save_cached_gpt_indices(const std::string& dir, const GptCacheKey& key, const GptIndices& indices);

}  // namespace gale
