// MindSpeed-LLM's instruction datasets at training time (--is-instruction-dataset): the split of
// the documents, DecoderPackedMTFDataset's sample order, and SFTTrainer.get_batch's samples.
//
// Split (megatron.legacy get_train_valid_test_split_): the --split numbers (',' or '/'
// separated, padded to three with zeros) are normalised; bounds[i+1] = bounds[i] +
// int(round(w_i * N)) (round half to even), then all bounds after the first are shifted so
// that the last equals N. Split i holds documents [bounds[i], bounds[i+1]).
//
// Order (_build_index_mappings): one numpy RandomState(seed) for the split; whole epochs of its
// documents, each arange(begin, end) shuffled in place (or in order with --no-shuffle), are
// appended until at least num_samples indices exist. Sample k is document order[k].
//
// Sample (S = --seq-length; the document's input ids and labels right-padded to S with the pad
// id and -100, as the collator pads to a multiple of S; the model predicts labels[1:] from
// input_ids[:-1]):
//   tokens[i] = input_ids[i], labels[i] = labels[i + 1] (the last label: none),
//   loss_mask[i] = 0 where the label is -100 (prompt, padding, last position), else 1.
// A label of -100 becomes id 0 (its loss mask is 0), pad tokens become 0 as in Megatron's
// samples; positions 0..S-1; one document per sample. Documents longer than S are an error
// (MindSpeed-LLM re-cuts them; preprocess with --seq-length <= the training one instead).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "data/indexed_dataset.h"
#include "data/sample.h"

namespace gale {

// [train_begin, valid_begin, test_begin, end]; errors name --split.
StatusOr<std::array<int64_t, 4>> legacy_split_bounds(const std::string& split, int64_t num_documents);

// The document order of one split (header comment).
std::vector<int64_t> instruction_sample_order(int64_t begin, int64_t end, int64_t num_samples, uint32_t seed,
                                              bool shuffle);

// The input_ids and labels datasets of prefix P (P_packed_input_ids_document, ...), checked to
// agree (int32, same sequence lengths; attention_mask must exist too).
struct InstructionSources {
  std::string prefix;
  std::unique_ptr<IndexedDataset> input_ids, labels;
  static StatusOr<std::shared_ptr<const InstructionSources>> open(const std::string& prefix, bool mmap);
  int64_t num_documents() const { return input_ids->num_sequences(); }
};

struct InstructionSampleOptions {
  int64_t seq_length = 0;
  int32_t pad = 0;         // the tokenizer's pad id (its EOS when it has none)
  int64_t vocab_size = 0;  // ids must be < this
};

// Builds the TrainingSample of one document (header comment). Fails on a document longer than
// seq_length or an id outside the vocabulary.
Status assemble_instruction_sample(std::span<const int32_t> input_ids, std::span<const int32_t> labels,
                                   const InstructionSampleOptions& o, TrainingSample* out);

// One split: documents [begin, end) in instruction_sample_order.
std::unique_ptr<SampleDataset> make_instruction_dataset(std::shared_ptr<const InstructionSources> sources,
                                                        std::vector<int64_t> order,
                                                        const InstructionSampleOptions& options);

}  // namespace gale
