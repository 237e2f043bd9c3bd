// GPTDataset (one token source, one split) and BlendedDataset: the sample order of Megatron's
// pretrain_gpt for the same data, split, seed, sequence length and sample counts.
//
// A TokenDataset returns the raw S + E token ids of sample k ("text" in Megatron's
// GPTDataset.__getitem__, before tokens/labels are cut from it).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/status.h"
#include "data/gpt_indices.h"
#include "data/split.h"
#include "data/token_source.h"

namespace gale {

inline constexpr int32_t kPadTokenSentinel = -1;  // Megatron's _PAD_TOKEN_ID

class TokenDataset {
 public:
  virtual ~TokenDataset() = default;
  virtual int64_t size() const = 0;
  virtual int add_extra_token() const = 0;
  virtual int64_t seq_length() const = 0;
  // S + E ids; positions past the end of the data (drop_last false only) hold `pad`.
  virtual Status sample_tokens(int64_t k, int32_t pad, std::vector<int32_t>* out) const = 0;
  // The lengths of the documents' parts that make up sample k's S + E ids, in order (Megatron's
  // document_lengths of _query_document_sample_shuffle_indices, before the padding); for
  // --dataloader-inter-document-masking. Datasets that cannot tell say so.
  virtual Status sample_document_lengths(int64_t k, std::vector<int64_t>* lengths) const;
  virtual std::string describe() const = 0;    // one line for the start-up log
  virtual bool loaded_from_cache() const = 0;  // every index came from --data-cache-path
};

// How GptDataset::build uses a non-empty --data-cache-path (Megatron-LM main's GPTDatasetConfig).
struct GptCacheMode {
  // --dataloader-fast-cache-load: the cached indices are mapped as they are (index_cache.h
  // load_trusted_gpt_indices): no description or consistency check, never a rebuild or a write.
  bool fast_cache_load = false;
  // --dataloader-defer-npy-index-mmap: build reads no cache file; the size comes from the sequence
  // lengths (gpt_cached_sample_count) and the three .npy files are mapped, trusted, at the first
  // sample read. A missing file is then that read's error.
  bool defer_npy_index_mmap = false;
};

class GptDataset : public TokenDataset {
 public:
  // Builds (or loads from `cache_dir` when it is not empty) the indices of sequences
  // [begin, end) of `source`. `split_text` and the parameters form the cache key. `mode` applies
  // only with a `cache_dir`.
  static StatusOr<std::unique_ptr<GptDataset>> build(std::shared_ptr<const TokenSource> source, DataSplit split,
                                                     int64_t begin, int64_t end, const GptIndexParams& params,
                                                     const std::string& cache_dir, const std::string& split_text,
                                                     const GptCacheMode& mode = {});

  int64_t size() const override { return deferred_ ? deferred_size_ : indices_.size(); }
  int add_extra_token() const override { return params_.add_extra_token; }
  int64_t seq_length() const override { return params_.seq_length; }
  Status sample_tokens(int64_t k, int32_t pad, std::vector<int32_t>* out) const override;
  Status sample_document_lengths(int64_t k, std::vector<int64_t>* lengths) const override;
  std::string describe() const override;

  // Under --dataloader-defer-npy-index-mmap empty until the first sample read (or load_indices).
  const GptIndices& indices() const { return indices_; }
  // Loads deferred indices now (once; their error every time after a failure); Ok otherwise.
  Status load_indices() const;
  bool deferred() const { return deferred_; }
  bool loaded_from_cache() const override { return loaded_from_cache_; }
  int64_t num_samples_requested() const { return params_.num_samples; }

 private:
  GptDataset() = default;
  std::shared_ptr<const TokenSource> source_;
  DataSplit split_ = DataSplit::kTrain;
  int64_t begin_ = 0, end_ = 0;
  GptIndexParams params_;
  // The sample's rows of the indices, bounds-checked when they were loaded without validation.
  Status sample_rows(int64_t k, int64_t* d0, int64_t* o0, int64_t* d1, int64_t* o1) const;
  mutable GptIndices indices_;
  bool loaded_from_cache_ = false;
  bool trusted_ = false;  // indices_ loaded by load_trusted_gpt_indices (not checked against the data)
  // --dataloader-defer-npy-index-mmap: the cache entry to load at the first read.
  bool deferred_ = false;
  int64_t deferred_size_ = 0;
  std::string cache_dir_, split_text_;
  mutable std::mutex load_mu_;
  mutable bool load_done_ = false;
  mutable Status load_status_;
};

class BlendedDataset : public TokenDataset {
 public:
  // `weights` are normalised again here, as Megatron's BlendedDataset does. size < 0 builds the
  // exhaustive blend (every sample of every dataset once, weights = sizes).
  static StatusOr<std::unique_ptr<BlendedDataset>> build(std::vector<std::unique_ptr<TokenDataset>> datasets,
                                                         const std::vector<double>& weights, int64_t size);

  int64_t size() const override { return static_cast<int64_t>(dataset_index_.size()); }
  int add_extra_token() const override { return datasets_.front()->add_extra_token(); }
  int64_t seq_length() const override { return datasets_.front()->seq_length(); }
  Status sample_tokens(int64_t k, int32_t pad, std::vector<int32_t>* out) const override;
  Status sample_document_lengths(int64_t k, std::vector<int64_t>* lengths) const override;
  std::string describe() const override;

  bool loaded_from_cache() const override;
  const std::vector<int16_t>& dataset_index() const { return dataset_index_; }
  const std::vector<int64_t>& dataset_sample_index() const { return dataset_sample_index_; }

 private:
  BlendedDataset() = default;
  std::vector<std::unique_ptr<TokenDataset>> datasets_;
  std::vector<double> weights_;
  std::vector<int16_t> dataset_index_;
  std::vector<int64_t> dataset_sample_index_;
};

}  // namespace gale
