// MindSpeed-LLM's pairwise (preference) datasets at training time (--is-pairwise-dataset, DPO):
// PREFIX_packed_{chosen,rejected}_{input_ids,labels}_document, one document per prompt.
//
// The documents are split and ordered as instruction datasets (data/instruction_dataset.h:
// legacy_split_bounds, instruction_sample_order). Sample k is the pair of document order[k]: its
// chosen and its rejected sequence, each assembled as an instruction sample
// (assemble_instruction_sample: right-padded to --seq-length, labels shifted left by one, loss
// mask 0 where the label is -100, i.e. on the prompt and the padding), as MindSpeed-LLM's
// PairwiseDataCollatorWithPadding pads both to the sequence length.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "data/indexed_dataset.h"
#include "data/instruction_dataset.h"
#include "data/sample.h"

namespace gale {

// The four dataset prefixes for --output-prefix / --data-path P:
// P_packed_{chosen_input_ids,chosen_labels,rejected_input_ids,rejected_labels}_document.
std::vector<std::string> pairwise_dataset_prefixes(const std::string& prefix);

// The four datasets of prefix P, checked to agree (int32, same document count, labels as long as
// their input ids).
struct PairwiseSources {
  std::string prefix;
  std::unique_ptr<IndexedDataset> chosen_input_ids, chosen_labels, rejected_input_ids, rejected_labels;
  static StatusOr<std::shared_ptr<const PairwiseSources>> open(const std::string& prefix, bool mmap);
  int64_t num_documents() const { return chosen_input_ids->num_sequences(); }
};

// One split of pairs. get() gives the chosen sample of a pair; get_pair() both.
class PairwiseDataset : public SampleDataset {
 public:
  PairwiseDataset(std::shared_ptr<const PairwiseSources> sources, std::vector<int64_t> order,
                  const InstructionSampleOptions& options);
  int64_t size() const override { return static_cast<int64_t>(order_.size()); }
  Status get(int64_t index, TrainingSample* out) const override;
  Status get_pair(int64_t index, TrainingSample* chosen, TrainingSample* rejected) const;  // thread-safe

 private:
  Status read(const IndexedDataset& ids, const IndexedDataset& labels, int64_t doc, TrainingSample* out) const;
  std::shared_ptr<const PairwiseSources> sources_;
  std::vector<int64_t> order_;
  InstructionSampleOptions o_;
};

}  // namespace gale
