// `gale pretrain --sft`'s datasets: Megatron-LM main's BlendedMegatronDatasetBuilder with
// SFTDataset (data/sft_dataset.h) for one JSONL file (--data-path FILE.jsonl, cut by --split) or
// one file per split (--train-data-path / --valid-data-path / --test-data-path, each used whole).
#pragma once

#include <functional>
#include <string>

#include "core/status.h"
#include "train/data_setup.h"

namespace gale {

// Fills out->train/valid/test (a split that needs no samples stays null); out->tokenizer must be the
// SFTTokenizer's Hugging Face tokenizer already. A needed split without lines is an error (Megatron
// would divide by zero when reading it); so are weights or several files for one split.
Status build_sft_data(const Arguments& args, const SplitSampleCounts& counts, PretrainData* out,
                      const std::function<void(const std::string&)>& log);

}  // namespace gale
