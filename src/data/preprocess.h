// The engine of `gale preprocess` (Megatron's tools/preprocess_data.py) and `gale merge-datasets`
// (tools/merge_datasets.py). Tokenisation is passed in as a function, so this layer does not
// depend on the tokenizers.
//
// Output equals Megatron's for the same tokens: one dataset per JSON key,
// "{prefix}_{key}_document.bin/.idx"; a document is the concatenation of its texts (a string,
// or each element of a list, each non-empty one its own sequence), plus the EOD token on its
// last sequence with --append-eod; documents that tokenize to nothing are kept as empty
// documents. Unlike Megatron, every key's dataset is finished (not only the last one).
//
// With a sentence splitter (--split-sentences) each text is cut into pieces of 1,000,000 code
// points, as Megatron does, each piece into sentences, and each sentence that tokenizes to
// something is its own sequence; the datasets are "{prefix}_{key}_sentence.bin/.idx". Megatron
// does this in two runs (the first only writes "{input}_ss.jsonl"); Gale in one, with the same
// output as Megatron's second run.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "data/indexed_dataset.h"

namespace gale {

using EncodeFn = std::function<Status(std::string_view text, std::vector<int32_t>* ids)>;
// The sentences of a text, as views into it (called from several threads at once).
using SplitFn = std::function<std::vector<std::string_view>(std::string_view text)>;

struct PreprocessOptions {
  std::string input;
  std::vector<std::string> json_keys = {"text"};
  std::string output_prefix;
  bool append_eod = false;
  int workers = 1;              // threads; output order is input order for any number
  int64_t log_interval = 1000;  // documents between progress lines (0: none)
  bool skip_bad_lines = false;  // count and skip malformed lines instead of stopping
  TokenDType dtype = TokenDType::kUInt16;
  int32_t eod = 0;
  int64_t vocab_size = 0;  // ids must lie in [0, vocab_size)
  SplitFn split_sentences;  // empty: every text is one sequence
};

struct PreprocessStats {
  int64_t documents = 0;      // records written (per key)
  int64_t skipped_lines = 0;  // bad lines skipped with skip_bad_lines
  int64_t blank_lines = 0;
  int64_t tokens = 0;       // all keys together
  int64_t input_bytes = 0;  // uncompressed
  double seconds = 0;
  std::vector<std::string> outputs;  // the dataset prefixes written
};

// "{output_prefix}_{key}_document", or "_sentence" when sentences are split.
std::string preprocess_output_prefix(const std::string& output_prefix, const std::string& key,
                                     bool sentences = false);

// Reads options.input, tokenizes with `encode` on options.workers threads and writes the
// datasets. Progress lines ("Processed N documents (x docs/s, y MB/s).") go to `log` (may be
// null). Errors name the input file and line; nothing is left behind on error.
StatusOr<PreprocessStats> run_preprocess(const PreprocessOptions& options, const EncodeFn& encode, std::FILE* log);

// Concatenates every PREFIX.bin/.idx pair in `input_dir`, in sorted prefix order, into
// output_prefix (Megatron's merge_datasets.py). A .bin without .idx (or the reverse) is an error;
// other files are ignored.
StatusOr<std::vector<std::string>> merge_datasets(const std::string& input_dir, const std::string& output_prefix);

}  // namespace gale
