// GPTDataset (one token source, one split) and BlendedDataset: the sample order of Megatron's
// pretrain_gpt for the same data, split, seed, sequence length and sample counts.
//
// A TokenDataset returns the raw S + E token ids of sample k ("text" in Megatron's
// GPTDataset.__getitem__, before tokens/labels are cut from it).
#pragma once

#include <cstdint>
#include <memory>
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

class GptDataset : public TokenDataset {
 public:
  // Builds (or loads from `cache_dir` when it is not empty) the indices of sequences
  // [begin, end) of `source`. `split_text` and the parameters form the cache key.
  static StatusOr<std::unique_ptr<GptDataset>> build(std::shared_ptr<const TokenSource> source, DataSplit split,
                                                     int64_t begin, int64_t end, const GptIndexParams& params,
                                                     const std::string& cache_dir, const std::string& split_text);

  int64_t size() const override { return indices_.size(); }
  int add_extra_token() const override { return params_.add_extra_token; }
  int64_t seq_length() const override { return params_.seq_length; }
  Status sample_tokens(int64_t k, int32_t pad, std::vector<int32_t>* out) const override;
  Status sample_document_lengths(int64_t k, std::vector<int64_t>* lengths) const override;
  std::string describe() const override;

  const GptIndices& indices() const { return indices_; }
  bool loaded_from_cache() const override { return loaded_from_cache_; }
  int64_t num_samples_requested() const { return params_.num_samples; }

 private:
  GptDataset() = default;
  std::shared_ptr<const TokenSource> source_;
  DataSplit split_ = DataSplit::kTrain;
  int64_t begin_ = 0, end_ = 0;
  GptIndexParams params_;
  GptIndices indices_;
  bool loaded_from_cache_ = false;
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
