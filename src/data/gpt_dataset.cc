// GPTDataset sample reads and BlendedDataset.
#include "data/gpt_dataset.h"

#include <algorithm>
#include <cstdio>

#include "data/blending.h"
#include "data/index_cache.h"
#include "data/numpy_math.h"

namespace gale {

StatusOr<std::unique_ptr<GptDataset>> GptDataset::build(std::shared_ptr<const TokenSource> source, DataSplit split,
                                                        int64_t begin, int64_t end, const GptIndexParams& params,
                                                        const std::string& cache_dir, const std::string& split_text,
                                                        const GptCacheMode& mode) {
  std::unique_ptr<GptDataset> ds(new GptDataset());
  ds->source_ = std::move(source);
  ds->split_ = split;
  ds->begin_ = begin;
  ds->end_ = end;
  ds->params_ = params;
  std::string name =
      str_cat(ds->source_->name(), " (", split_name(split), " split, sequences [", begin, ", ", end, "))");
  GptCacheKey key{ds->source_->name(), cache_dir.empty() ? "" : ds->source_->fingerprint(), split, begin, end, params,
                  split_text};
  if (!cache_dir.empty() && mode.defer_npy_index_mmap) {
    ds->deferred_ = true;
    ds->trusted_ = true;
    ds->loaded_from_cache_ = true;
    ds->cache_dir_ = cache_dir;
    ds->split_text_ = split_text;
    ds->deferred_size_ = gpt_cached_sample_count(key, ds->source_->sequence_lengths());
    return ds;
  }
  if (!cache_dir.empty() && mode.fast_cache_load) {
    GALE_ASSIGN_OR_RETURN(ds->indices_, load_trusted_gpt_indices(cache_dir, key, ds->source_->sequence_lengths(),
                                                                 "--dataloader-fast-cache-load"));
    ds->trusted_ = true;
    ds->loaded_from_cache_ = true;
    return ds;
  }
  if (!cache_dir.empty()) {
    auto cached = load_cached_gpt_indices(cache_dir, key, ds->source_->sequence_lengths());
    if (cached.ok()) {
      ds->indices_ = std::move(cached).value();
      ds->loaded_from_cache_ = true;
      return ds;
    }
  }
  GALE_ASSIGN_OR_RETURN(ds->indices_, build_gpt_indices(ds->source_->sequence_lengths(), begin, end, params, name));
  if (!cache_dir.empty()) GALE_RETURN_IF_ERROR(save_cached_gpt_indices(cache_dir, key, ds->indices_));
  return ds;
}

Status GptDataset::load_indices() const {
  if (!deferred_) return Status::Ok();
  std::lock_guard<std::mutex> lock(load_mu_);
  if (load_done_) return load_status_;
  load_done_ = true;
  GptCacheKey key{source_->name(), source_->fingerprint(), split_, begin_, end_, params_, split_text_};
  StatusOr<GptIndices> loaded =
      load_trusted_gpt_indices(cache_dir_, key, source_->sequence_lengths(), "--dataloader-defer-npy-index-mmap");
  if (!loaded.ok()) {
    load_status_ = loaded.status();
    return load_status_;
  }
  if (loaded->size() != deferred_size_) {
    load_status_ = DataLoss(gpt_cache_base(cache_dir_, key), "shuffle_index.npy holds ", loaded->size(),
                            " samples; the dataset has ", deferred_size_, " (--dataloader-defer-npy-index-mmap trusts "
                            "--data-cache-path ", cache_dir_, "; rebuild the cache without it)");
    return load_status_;
  }
  indices_ = std::move(loaded).value();
  return Status::Ok();
}

Status GptDataset::sample_rows(int64_t k, int64_t* d0, int64_t* o0, int64_t* d1, int64_t* o1) const {
  if (k < 0 || k >= size()) return OutOfRange(source_->name(), ": sample ", k, " out of range [0, ", size(), ")");
  GALE_RETURN_IF_ERROR(load_indices());
  const int64_t j = indices_.shuffle()[static_cast<size_t>(k)];
  const int64_t rows = static_cast<int64_t>(indices_.samples().size() / 2);
  if (trusted_ && (j < 0 || j + 1 >= rows))
    return DataLoss(source_->name(), ": cached shuffle index entry ", k, " = ", j, " is outside the sample index");
  const int64_t* si = indices_.samples().data();
  *d0 = si[2 * j], *o0 = si[2 * j + 1], *d1 = si[2 * j + 2], *o1 = si[2 * j + 3];
  if (trusted_) {
    const std::span<const int32_t> documents = indices_.documents();
    const int64_t docs = static_cast<int64_t>(documents.size());
    if (*d0 < 0 || *d1 < *d0 || *d1 >= docs || *o0 < 0 || *o1 < 0)
      return DataLoss(source_->name(), ": cached sample index row ", j, " is out of range");
    for (int64_t i = *d0; i <= *d1; ++i) {
      const int32_t seq = documents[static_cast<size_t>(i)];
      if (seq < begin_ || seq >= end_)
        return DataLoss(source_->name(), ": cached document index entry ", i, " = ", seq, " is outside the split");
    }
    const auto& sizes = source_->sequence_lengths();
    if (*o0 > sizes[documents[static_cast<size_t>(*d0)]] || (*d0 == *d1 && *o1 < *o0))
      return DataLoss(source_->name(), ": cached sample index row ", j, " has an offset outside its document");
  }
  return Status::Ok();
}

Status GptDataset::sample_tokens(int64_t k, int32_t pad, std::vector<int32_t>* out) const {
  int64_t d0 = 0, o0 = 0, d1 = 0, o1 = 0;
  GALE_RETURN_IF_ERROR(sample_rows(k, &d0, &o0, &d1, &o1));
  const int64_t want = params_.seq_length + params_.add_extra_token;
  out->resize(static_cast<size_t>(want));
  const std::span<const int32_t> doc = indices_.documents();
  const auto& sizes = source_->sequence_lengths();
  int64_t filled = 0;
  auto take = [&](int64_t position, int64_t offset, int64_t length) -> Status {
    int32_t seq = doc[static_cast<size_t>(position)];
    if (length < 0) length = sizes[seq] - offset;
    if (filled + length > want)
      return DataLoss(source_->name(), ": sample ", k, " is longer than ", want, " tokens (corrupt index cache?)");
    GALE_RETURN_IF_ERROR(source_->read(seq, offset, length, out->data() + filled));
    filled += length;
    return Status::Ok();
  };
  const int64_t e = params_.add_extra_token;
  if (d0 == d1) {
    GALE_RETURN_IF_ERROR(take(d0, o0, o1 - o0 + e));
  } else {
    for (int64_t i = d0; i <= d1; ++i) {
      int64_t offset = i > d0 ? 0 : o0;
      int64_t length = i < d1 ? -1 : o1 + e;
      GALE_RETURN_IF_ERROR(take(i, offset, length));
    }
  }
  std::fill(out->begin() + filled, out->end(), pad);
  return Status::Ok();
}

Status TokenDataset::sample_document_lengths(int64_t, std::vector<int64_t>*) const {
  return Unimplemented(describe(), ": the document boundaries of its samples are not known "
                       "(--dataloader-inter-document-masking needs a GPT dataset or a blend of them)");
}

Status GptDataset::sample_document_lengths(int64_t k, std::vector<int64_t>* lengths) const {
  int64_t d0 = 0, o0 = 0, d1 = 0, o1 = 0;
  GALE_RETURN_IF_ERROR(sample_rows(k, &d0, &o0, &d1, &o1));
  lengths->clear();
  const int64_t e = params_.add_extra_token;
  if (d0 == d1) {
    lengths->push_back(o1 - o0 + e);
    return Status::Ok();
  }
  const auto& sizes = source_->sequence_lengths();
  for (int64_t i = d0; i <= d1; ++i) {
    const int64_t offset = i > d0 ? 0 : o0;
    lengths->push_back(i < d1 ? sizes[indices_.documents()[static_cast<size_t>(i)]] - offset : o1 + e);
  }
  return Status::Ok();
}

std::string GptDataset::describe() const {
  if (deferred_) {
    std::lock_guard<std::mutex> lock(load_mu_);
    if (!load_done_)
      return str_cat(source_->name(), " ", split_name(split_), " split: sequences [", begin_, ", ", end_, "), ", size(),
                     " samples (indices from cache, read at the first sample)");
  }
  return str_cat(source_->name(), " ", split_name(split_), " split: sequences [", begin_, ", ", end_, "), ",
                 indices_.tokens_per_epoch, " tokens per epoch, ", indices_.num_epochs, " epoch(s), ", size(),
                 " samples", loaded_from_cache_ ? " (indices from cache)" : "");
}

StatusOr<std::unique_ptr<BlendedDataset>> BlendedDataset::build(std::vector<std::unique_ptr<TokenDataset>> datasets,
                                                                const std::vector<double>& weights, int64_t size) {
  if (datasets.empty()) return InvalidArgument("a blend needs at least one dataset");
  if (datasets.size() >= 32767)
    return InvalidArgument("a blend takes fewer than 32767 datasets, found ", datasets.size());
  std::unique_ptr<BlendedDataset> b(new BlendedDataset());
  if (size < 0) {
    std::vector<int64_t> sizes;
    for (const auto& d : datasets) sizes.push_back(d->size());
    build_exhaustive_blending_indices(sizes, &b->dataset_index_, &b->dataset_sample_index_);
    std::vector<double> w(sizes.begin(), sizes.end());
    b->weights_ = numpy_normalize(w);
  } else {
    if (weights.size() != datasets.size())
      return Internal("blend: ", weights.size(), " weights for ", datasets.size(), " datasets");
    b->weights_ = numpy_normalize(weights);
    build_blending_indices(b->weights_, size, &b->dataset_index_, &b->dataset_sample_index_);
  }
  // Every draw must exist in its dataset (Megatron checks this lazily on access).
  std::vector<int64_t> needed(datasets.size(), 0);
  for (size_t t = 0; t < b->dataset_index_.size(); ++t) {
    size_t d = static_cast<size_t>(b->dataset_index_[t]);
    needed[d] = std::max(needed[d], b->dataset_sample_index_[t] + 1);
  }
  for (size_t d = 0; d < datasets.size(); ++d)
    if (needed[d] > datasets[d]->size())
      return FailedPrecondition("blend: dataset ", d, " (", datasets[d]->describe(), ") has ", datasets[d]->size(),
                                " samples but the blend draws ", needed[d]);
  b->datasets_ = std::move(datasets);
  return b;
}

Status BlendedDataset::sample_tokens(int64_t k, int32_t pad, std::vector<int32_t>* out) const {
  if (k < 0 || k >= size()) return OutOfRange("blended dataset: sample ", k, " out of range [0, ", size(), ")");
  const auto& d = datasets_[static_cast<size_t>(dataset_index_[static_cast<size_t>(k)])];
  return d->sample_tokens(dataset_sample_index_[static_cast<size_t>(k)], pad, out);
}

Status BlendedDataset::sample_document_lengths(int64_t k, std::vector<int64_t>* lengths) const {
  if (k < 0 || k >= size()) return OutOfRange("blended dataset: sample ", k, " out of range [0, ", size(), ")");
  const auto& d = datasets_[static_cast<size_t>(dataset_index_[static_cast<size_t>(k)])];
  return d->sample_document_lengths(dataset_sample_index_[static_cast<size_t>(k)], lengths);
}

bool BlendedDataset::loaded_from_cache() const {
  for (const auto& d : datasets_)
    if (!d->loaded_from_cache()) return false;
  return true;
}

std::string BlendedDataset::describe() const {
  std::string s = str_cat("blend of ", datasets_.size(), " datasets, ", size(), " samples; weights");
  for (double w : weights_) {
    char buf[32];
    std::snprintf(buf, sizeof buf, " %.4f", w);
    s += buf;
  }
  return s + (loaded_from_cache() ? " (indices from cache)" : "");
}

}  // namespace gale
