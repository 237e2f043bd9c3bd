// GPTFIMDataset: FIM samples with Megatron's per-worker random streams (see data/fim_dataset.h).
#include "data/fim_dataset.h"

#include <algorithm>

#include "core/status.h"

namespace gale {

FimDataset::FimDataset(std::unique_ptr<TokenDataset> base, const FimOptions& options,
                       std::shared_ptr<const HuggingFaceTokenizer> tokenizer, uint32_t seed,
                       std::shared_ptr<FimLoader> loader)
    : base_(std::move(base)), options_(options), tokenizer_(std::move(tokenizer)), loader_(std::move(loader)) {
  streams_.assign(static_cast<size_t>(std::max<int64_t>(1, loader_->num_workers)), NumpyRandomState(seed));
}

Status FimDataset::sample_tokens(int64_t k, int32_t pad, std::vector<int32_t>* out) const {
  std::vector<int32_t> text;
  GALE_RETURN_IF_ERROR(base_->sample_tokens(k, pad, &text));
  std::lock_guard<std::mutex> lock(loader_->mu);
  const int64_t micro_batch = loader_->reads++ / std::max<int64_t>(1, loader_->micro_batch_size);
  NumpyRandomState& rng = streams_[static_cast<size_t>(micro_batch % static_cast<int64_t>(streams_.size()))];
  Status s = fim_transform(text, options_, *tokenizer_, rng, out);
  if (!s.ok()) return Status(s.code(), str_cat("--fim-data: sample ", k, ": ", s.message()));
  return Status::Ok();
}

Status FimDataset::sample_document_lengths(int64_t k, std::vector<int64_t>* lengths) const {
  GALE_RETURN_IF_ERROR(base_->sample_document_lengths(k, lengths));
  int64_t total = 0;
  for (int64_t n : *lengths) total += n;
  lengths->assign(1, total);
  return Status::Ok();
}

std::string FimDataset::describe() const {
  return str_cat(base_->describe(), " | FIM: rate ", options_.rate, ", SPM rate ", options_.spm_rate,
                 options_.split_sample >= 0 ? str_cat(", split id ", options_.split_sample, ", fragment rate ",
                                                      options_.fragment_rate)
                                            : std::string(),
                 ", ", streams_.size(), " stream(s)");
}

}  // namespace gale
