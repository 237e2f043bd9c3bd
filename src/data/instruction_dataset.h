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
//
// Packed samples (DecoderPackedMTFDataset.__getitem__ with --reset-attention-mask), over the
// stored ids (positions past them are padding and keep the last document and position run):
//   --neat-pack: the attention mask numbers the pack's samples 1, 2, ... and is 0 on its padding;
//     the document of a position is its mask value, and with --reset-position-ids positions count
//     from 0 within each sample (0 on the padding), as _get_neat_pack_position_ids;
//   otherwise: a new document starts after each EOS token (Megatron's EOD reset, the EOS staying
//     with the document it ends), and --reset-position-ids restarts the positions there.
// Attention then stays inside each document (MindSpeed-LLM passes the boundaries to flash
// attention as actual_seq_len); --reset-position-ids needs --reset-attention-mask, the only place
// MindSpeed-LLM resets them.
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
  std::unique_ptr<IndexedDataset> input_ids, attention_mask, labels;
  static StatusOr<std::shared_ptr<const InstructionSources>> open(const std::string& prefix, bool mmap);
  int64_t num_documents() const { return input_ids->num_sequences(); }
};

struct InstructionSampleOptions {
  int64_t seq_length = 0;
  int32_t pad = 0;         // the tokenizer's pad id (its EOS when it has none)
  int64_t vocab_size = 0;  // ids must be < this
  // Packed samples (header comment): documents from the attention mask (neat_pack) or the EOS.
  bool reset_attention_mask = false;
  bool reset_position_ids = false;
  bool neat_pack = false;
  int32_t eos = -1;  // the tokenizer's EOS
};

// Builds the TrainingSample of one document (header comment); `attention_mask` (same length as the
// ids) is read with neat_pack only. Fails on a document longer than seq_length or an id outside
// the vocabulary.
Status assemble_instruction_sample(std::span<const int32_t> input_ids, std::span<const int32_t> labels,
                                   std::span<const int32_t> attention_mask, const InstructionSampleOptions& o,
                                   TrainingSample* out);

// One split: documents [begin, end) in instruction_sample_order.
std::unique_ptr<SampleDataset> make_instruction_dataset(std::shared_ptr<const InstructionSources> sources,
                                                        std::vector<int64_t> order,
                                                        const InstructionSampleOptions& options);

}  // namespace gale
