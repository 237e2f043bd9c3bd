// Megatron-LM main's --per-dataset-sequences-path: one JSON file of every dataset prefix's
// sequence and document counts, standing for the headers of their .idx files.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "core/status.h"
#include "data/indexed_dataset.h"

namespace gale {

// The file Megatron's tools/build_sequences_per_dataset.py writes: a JSON object mapping each
// prefix (as spelled in --data-path & co.) to [sequence_count, document_count]. An empty object
// stands for no file (Megatron then reads the .idx headers). Errors name the flag and the file.
struct SequencesPerDataset {
  std::string path;
  std::map<std::string, std::pair<int64_t, int64_t>> counts;
};
StatusOr<SequencesPerDataset> load_sequences_per_dataset(const std::string& path);

// GPTDatasetConfig.token_dtype_code: with the file, Megatron reads tokens as uint16 when the
// tokenizer's vocabulary has at most 65536 entries, else as int32 (not the .idx's dtype byte).
TokenDType sequences_per_dataset_dtype(int64_t vocab_size);

// Megatron reads `prefix`'s arrays with the file's counts and that dtype instead of its header.
// Gale maps the .idx anyway, so it checks that they agree with the header, and refuses a prefix
// the file does not list (Megatron's KeyError) or a stale entry (where Megatron would read the
// arrays at the wrong offsets).
Status check_declared_index(const SequencesPerDataset& file, const IndexedDataset& dataset, int64_t vocab_size);

}  // namespace gale
