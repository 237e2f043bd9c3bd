// Training samples as the model consumes them, and the dataset interface the trainer reads.
//
// assemble_sample is Megatron's GPTDataset.__getitem__ + _get_ltor_masks_and_position_ids on
// the S + E raw ids of a sample: tokens/labels, loss mask, position ids and the per-token
// document ids that express --reset-attention-mask's block-diagonal causal mask (with MindSpeed's
// --fix-sub-seq-length L: blocks of L positions instead of the documents).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace gale {

// One training sample (all vectors have S = --seq-length entries).
struct TrainingSample {
  std::vector<int32_t> tokens;        // input ids
  std::vector<int32_t> labels;        // next-token ids
  std::vector<float> loss_mask;       // 0 at pads, and at EOD with --eod-mask-loss
  std::vector<int32_t> position_ids;  // arange(S), restarted after each EOD with --reset-position-ids
  std::vector<int32_t> document_ids;  // per token: index of its document inside the sample (0, 1, ...),
                                      // incremented after each EOD; all 0 unless --reset-attention-mask;
                                      // with --fix-sub-seq-length L: position / L (attention blocks).
                                      // Attention is allowed only between tokens with equal ids.
  // Positions before the right padding (instruction samples: the document's tokens); the rest are
  // padding with loss mask 0, which no earlier position attends to. 0: no padding (all of them).
  int64_t unpadded_length = 0;
};

struct SampleOptions {
  int32_t eod = 0;
  // Megatron's pad id: tokenizer.pad when the tokenizer has one, else -1. Label positions equal
  // to it get loss 0, and token/label ids equal to it become 0 (as Megatron does).
  int32_t pad = -1;
  bool eod_mask_loss = false;
  bool reset_position_ids = false;
  bool reset_attention_mask = false;
  // MindSpeed's --fix-sub-seq-length L: with reset_attention_mask and 0 < L <= S, token i's
  // "document" is i / L, whatever the EODs (MindSpeed replaces the documents' actual_seq_len by
  // L, 2L, ..., S); the position ids and the loss mask still follow the EODs. Otherwise ignored.
  int64_t fix_sub_seq_length = -1;
  int64_t vocab_size = 0;  // ids must be < this (0 = unchecked); catches datasets made with another tokenizer
  // Megatron's --dataloader-inter-document-masking (apply_inter_document_masking).
  bool inter_document_masking = false;
};

// `text` holds S + add_extra_token ids.
void assemble_sample(std::span<const int32_t> text, int add_extra_token, const SampleOptions& options,
                     TrainingSample* out);

// Megatron's GPTDataset with inter_document_masking (--dataloader-inter-document-masking), after
// assemble_sample: `part_lengths` are the sample's document parts (TokenDataset::
// sample_document_lengths, S + add_extra_token ids in all, padding excluded). The extra token is
// taken off the last part (a part left empty is dropped), a sample shorter than S (padding) gives
// the shortfall to its last part, and each part becomes one attention document (document ids 0, 1,
// ... over the non-empty parts) whose position ids count from 0 — whatever the EODs and
// --reset-attention-mask / --reset-position-ids say; the loss mask is unchanged. Megatron passes
// the parts as cu_seqlens to its packed-sequence attention.
void apply_inter_document_masking(std::vector<int64_t> part_lengths, int add_extra_token, TrainingSample* sample);

// One split (train, valid or test), possibly a blend.
class SampleDataset {
 public:
  virtual ~SampleDataset() = default;
  virtual int64_t size() const = 0;
  virtual Status get(int64_t index, TrainingSample* out) const = 0;  // thread-safe
};

class TokenDataset;
// The SampleDataset over a TokenDataset (GptDataset or BlendedDataset). get() fails with a
// message naming the sample when an id is outside [0, vocab_size).
std::unique_ptr<SampleDataset> make_sample_dataset(std::unique_ptr<TokenDataset> tokens, const SampleOptions& options);
// The TokenDataset under a SampleDataset made by make_sample_dataset (for `gale data-samples`).
const TokenDataset* token_dataset_of(const SampleDataset& ds);

}  // namespace gale
