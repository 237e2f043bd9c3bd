// The bridge from `gale pretrain`'s flags to the tokenizer and the train/valid/test sample
// datasets, built exactly as Megatron's pretrain_gpt builds them (BlendedMegatronDatasetBuilder
// with GPTDataset / MockGPTDataset), so that sample k of `train` is Megatron's k-th sample.
//
// TrainingSample and SampleDataset are defined in data/sample.h (included here). The trainer
// reads train->get(consumed), get(consumed + 1), ... (Megatron's MegatronPretrainingSampler:
// each iteration takes global-batch-size consecutive indices; data-parallel rank r of each
// micro-batch chunk of mbs*dp indices takes [r*mbs, (r+1)*mbs)), or with --dataloader-type cyclic
// Megatron's shuffled order (data/random_sampler.h); either way resuming at
// consumed_train_samples reads the same samples as an uninterrupted run.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "core/status.h"
#include "data/sample.h"
#include "tokenizer/tokenizer.h"
#include "train/arguments.h"

namespace gale {

struct PretrainData {
  std::unique_ptr<Tokenizer>
      tokenizer;           // from the TokenizerArgs (NullTokenizer for --mock-data without tokenizer flags)
  int64_t vocab_size = 0;  // the tokenizer's vocabulary size as Megatron reports it (before padding)
  int32_t eod = 0;
  std::unique_ptr<SampleDataset> train, valid, test;  // null when the split is empty and not needed
};

// Builds tokenizer + datasets exactly as Megatron's pretrain_gpt does for these flags (num
// samples per split: train = train_iters*gbs or --train-samples; valid =
// (train_iters // eval_interval + 1) * eval_iters * gbs; test = eval_iters * gbs). `args` must
// have been validated (global_batch_size known). Prints a short description on rank 0.
StatusOr<PretrainData> build_pretrain_data(const Arguments& args);
// The same, with the description lines sent to `log` instead of print_rank0.
StatusOr<PretrainData> build_pretrain_data(const Arguments& args, const std::function<void(const std::string&)>& log);

// The pieces, for `gale data-samples` and tests.
struct SplitSampleCounts {
  int64_t train = 0, valid = 0, test = 0;
};
SplitSampleCounts pretrain_sample_counts(const Arguments& args);
// The tokenizer pretrain uses: --tokenizer-type (default GPT2BPETokenizer), or NullTokenizer with
// --vocab-size when --mock-data is given without any tokenizer flag.
StatusOr<std::unique_ptr<Tokenizer>> build_pretrain_tokenizer(const Arguments& args);

// The tokenizer layer's options from the tokenizer flags (pretrain, preprocess, generate, ...).
TokenizerOptions tokenizer_options(const TokenizerArgs& t);

}  // namespace gale
