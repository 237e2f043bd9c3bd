// Sample assembly and the SampleDataset over token datasets.
#include "data/sample.h"

#include "data/gpt_dataset.h"

namespace gale {

void assemble_sample(std::span<const int32_t> text, int add_extra_token, const SampleOptions& o, TrainingSample* out) {
  const size_t s = text.size() - static_cast<size_t>(add_extra_token);
  out->tokens.assign(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(s));
  out->labels.assign(text.begin() + 1, text.end());
  if (!add_extra_token) out->labels.push_back(o.pad);  // Megatron: roll(text, -1) with the last label a pad
  out->loss_mask.assign(s, 1.0f);
  out->position_ids.resize(s);
  out->document_ids.assign(s, 0);
  const bool fixed_blocks = o.reset_attention_mask && o.fix_sub_seq_length > 0 &&
                            o.fix_sub_seq_length <= static_cast<int64_t>(s);
  int32_t position = 0, document = 0;
  for (size_t i = 0; i < s; ++i) {
    out->position_ids[i] = o.reset_position_ids ? position : static_cast<int32_t>(i);
    if (o.reset_attention_mask)
      out->document_ids[i] = fixed_blocks ? static_cast<int32_t>(static_cast<int64_t>(i) / o.fix_sub_seq_length)
                                          : document;
    ++position;
    if (out->tokens[i] == o.eod) {
      if (o.eod_mask_loss) out->loss_mask[i] = 0.0f;
      position = 0;
      ++document;
    }
  }
  for (size_t i = 0; i < s; ++i) {
    if (out->labels[i] == o.pad) {
      out->loss_mask[i] = 0.0f;
      out->labels[i] = 0;
    }
    if (out->tokens[i] == o.pad) out->tokens[i] = 0;
  }
}

void apply_inter_document_masking(std::vector<int64_t> parts, int add_extra_token, TrainingSample* sample) {
  const int64_t S = static_cast<int64_t>(sample->tokens.size());
  if (add_extra_token && !parts.empty()) {
    parts.back() -= 1;
    if (parts.back() == 0) parts.pop_back();
  }
  int64_t total = 0;
  for (int64_t p : parts) total += p;
  if (total < S) {
    if (parts.empty()) parts.push_back(S - total);
    else parts.back() += S - total;
  }
  int64_t start = 0;
  int32_t document = 0;
  for (int64_t p : parts) {
    if (p <= 0) continue;
    for (int64_t i = 0; i < p && start + i < S; ++i) {
      sample->document_ids[static_cast<size_t>(start + i)] = document;
      sample->position_ids[static_cast<size_t>(start + i)] = static_cast<int32_t>(i);
    }
    start += p;
    ++document;
  }
}

namespace {
class TokenSampleDataset : public SampleDataset {
 public:
  TokenSampleDataset(std::unique_ptr<TokenDataset> tokens, const SampleOptions& o)
      : tokens_(std::move(tokens)), o_(o) {}
  int64_t size() const override { return tokens_->size(); }
  Status get(int64_t index, TrainingSample* out) const override {
    thread_local std::vector<int32_t> text;
    GALE_RETURN_IF_ERROR(tokens_->sample_tokens(index, o_.pad, &text));
    if (o_.vocab_size > 0) {
      for (size_t i = 0; i < text.size(); ++i) {
        int32_t t = text[i];
        if (t == o_.pad) continue;
        if (t < 0 || t >= o_.vocab_size)
          return DataLoss("sample ", index, " (", tokens_->describe(), "): token id ", t, " at position ", i,
                          " is outside the tokenizer's vocabulary [0, ", o_.vocab_size,
                          "); was the dataset made with another tokenizer?");
      }
    }
    assemble_sample(text, tokens_->add_extra_token(), o_, out);
    if (o_.inter_document_masking) {
      thread_local std::vector<int64_t> parts;
      GALE_RETURN_IF_ERROR(tokens_->sample_document_lengths(index, &parts));
      apply_inter_document_masking(parts, tokens_->add_extra_token(), out);
    }
    return Status::Ok();
  }
  const TokenDataset* tokens() const { return tokens_.get(); }

 private:
  std::unique_ptr<TokenDataset> tokens_;
  SampleOptions o_;
};
}  // namespace

std::unique_ptr<SampleDataset> make_sample_dataset(std::unique_ptr<TokenDataset> tokens, const SampleOptions& options) {
  return std::make_unique<TokenSampleDataset>(std::move(tokens), options);
}

const TokenDataset* token_dataset_of(const SampleDataset& ds) {
  auto* t = dynamic_cast<const TokenSampleDataset*>(&ds);
  return t ? t->tokens() : nullptr;
}

}  // namespace gale
