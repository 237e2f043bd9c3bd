// Megatron's GPTFIMDataset (--fim-data): a GPT dataset whose samples go through the
// fill-in-the-middle transformation of data/fim.h, with Megatron's random streams.
//
// Megatron's dataset holds one numpy RandomState(--seed), made when the dataset is built and
// advanced by every sample it returns, so a sample depends on the samples read before it by the
// same copy of the dataset. The copies are those of Megatron's data loader: each data-parallel rank
// builds its own datasets, and with --num-workers W > 0 torch's DataLoader forks W workers, each
// with its own copy, and hands them the rank's micro-batches in turn (micro-batch m to worker
// m mod W). Gale reproduces this: the FimDatasets of one split share a FimLoader that counts the
// samples the rank reads (micro-batch = count / --micro-batch-size), and each FimDataset keeps one
// RandomState(--seed) per worker, drawn from only for the samples of that worker's micro-batches.
// So a run reads, token for token, the FIM samples Megatron's run reads at the same layout, as long
// as the samples are read in the data loader's order from a fresh start (a resumed run starts the
// streams afresh at its consumed samples, as Megatron's rebuilt loader does).
//
// --iterations-to-skip: Megatron's dummy_train_step pulls a skipped iteration's micro-batches
// through the loader, so their FIM draws are made; Gale's trainer reads (and drops) them too
// (Trainer::read_skipped_micro_batches), and the next iteration gets the samples Megatron's gets.
// Virtual pipeline stages: Megatron builds the datasets once per model chunk, each with a fresh
// RandomState(--seed), but only on the chunks of the first and the last pipeline stage
// (is_dataset_built_on_rank), and each of those reads every micro-batch once, in order: chunk 0
// of the first stage gives the inputs, chunk V-1 of the last the labels, and both streams draw the
// same values. Gale's pipeline stages each load every micro-batch once, in order, whatever the
// chunk count, so one FimDataset per rank reproduces both chunks' streams. (Megatron-LM main's
// dummy_train_step calls next() on the list of per-chunk iterators, so it cannot skip iterations
// with virtual stages; Gale skips them as above.)
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "data/fim.h"
#include "data/gpt_dataset.h"

namespace gale {

// The read counter of one split's data loader on this rank.
struct FimLoader {
  int64_t micro_batch_size = 1;
  int64_t num_workers = 0;  // 0: the loader reads in the main process (one stream)
  std::mutex mu;
  int64_t reads = 0;
};

class FimDataset : public TokenDataset {
 public:
  FimDataset(std::unique_ptr<TokenDataset> base, const FimOptions& options,
             std::shared_ptr<const HuggingFaceTokenizer> tokenizer, uint32_t seed, std::shared_ptr<FimLoader> loader);

  int64_t size() const override { return base_->size(); }
  int add_extra_token() const override { return base_->add_extra_token(); }
  int64_t seq_length() const override { return base_->seq_length(); }
  // The base sample through fim_transform with the stream of the loader's next read.
  Status sample_tokens(int64_t k, int32_t pad, std::vector<int32_t>* out) const override;
  // One part of the base sample's whole length: Megatron's GPTFIMDataset returns [sample_len] as the
  // document lengths, so --dataloader-inter-document-masking makes the FIM sample one attention
  // document (positions 0, 1, ... whatever its EODs).
  Status sample_document_lengths(int64_t k, std::vector<int64_t>* lengths) const override;
  std::string describe() const override;
  bool loaded_from_cache() const override { return base_->loaded_from_cache(); }

 private:
  std::unique_ptr<TokenDataset> base_;
  FimOptions options_;
  std::shared_ptr<const HuggingFaceTokenizer> tokenizer_;
  std::shared_ptr<FimLoader> loader_;
  mutable std::vector<NumpyRandomState> streams_;  // one per worker
};

}  // namespace gale
