// Bridge from the pretrain flags to the tokenizer and the train/valid/test sample datasets.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/status.h"
#include "tokenizer/tokenizer.h"
#include "train/arguments.h"
#include "train/sample_dataset.h"

namespace gale {

struct PretrainData {
  std::unique_ptr<Tokenizer> tokenizer;  // from the TokenizerArgs (NullTokenizer for --mock-data without tokenizer flags)
  int64_t vocab_size = 0;                // the tokenizer's vocabulary size as Megatron reports it (before padding)
  int32_t eod = 0;
  std::unique_ptr<SampleDataset> train, valid, test;  // null when the split is empty and not needed
};

// Builds tokenizer + datasets exactly as Megatron's pretrain_gpt does for these flags
// (num samples per split: train = train_iters*gbs or --train-samples; valid =
// (train_iters // eval_interval + 1) * eval_iters * gbs; test = eval_iters * gbs).
StatusOr<PretrainData> build_pretrain_data(const Arguments& args);

}  // namespace gale
