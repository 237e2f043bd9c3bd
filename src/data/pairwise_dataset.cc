// Pairwise (chosen/rejected) datasets for DPO training (data/pairwise_dataset.h).
#include "data/pairwise_dataset.h"

#include "data/instruction_preprocess.h"

namespace gale {

std::vector<std::string> pairwise_dataset_prefixes(const std::string& prefix) {
  std::vector<std::string> out;
  for (const char* key : {"chosen_input_ids", "chosen_labels", "rejected_input_ids", "rejected_labels"})
    out.push_back(prefix + "_packed_" + key + "_document");
  return out;
}

StatusOr<std::shared_ptr<const PairwiseSources>> PairwiseSources::open(const std::string& prefix, bool mmap) {
  auto s = std::make_shared<PairwiseSources>();
  s->prefix = prefix;
  const std::vector<std::string> names = pairwise_dataset_prefixes(prefix);
  std::unique_ptr<IndexedDataset>* slots[4] = {&s->chosen_input_ids, &s->chosen_labels, &s->rejected_input_ids,
                                               &s->rejected_labels};
  for (int i = 0; i < 4; ++i) {
    auto d = IndexedDataset::open(names[i], mmap);
    if (!d.ok())
      return Status(d.status().code(), str_cat("--data-path ", prefix, " (--is-pairwise-dataset): ",
                                               d.status().message()));
    *slots[i] = std::move(d).value();
    if ((*slots[i])->dtype() != TokenDType::kInt32)
      return DataLoss("--data-path ", names[i], ": expected int32 ids (MindSpeed-LLM's pairwise datasets), found ",
                      token_dtype_name((*slots[i])->dtype()));
    if ((*slots[i])->num_sequences() != s->chosen_input_ids->num_sequences())
      return DataLoss("--data-path ", prefix, ": ", names[i], " has ", (*slots[i])->num_sequences(),
                      " sequences but ", names[0], " has ", s->chosen_input_ids->num_sequences());
  }
  for (int64_t i = 0; i < s->num_documents(); ++i) {
    if (s->chosen_input_ids->sequence_lengths()[i] != s->chosen_labels->sequence_lengths()[i] ||
        s->rejected_input_ids->sequence_lengths()[i] != s->rejected_labels->sequence_lengths()[i])
      return DataLoss("--data-path ", prefix, ": pair ", i, " has labels of another length than its input ids");
  }
  return std::shared_ptr<const PairwiseSources>(std::move(s));
}

PairwiseDataset::PairwiseDataset(std::shared_ptr<const PairwiseSources> sources, std::vector<int64_t> order,
                                 const InstructionSampleOptions& options)
    : sources_(std::move(sources)), order_(std::move(order)), o_(options) {
  o_.reset_attention_mask = o_.reset_position_ids = o_.neat_pack = false;  // one sequence per sample
}

Status PairwiseDataset::read(const IndexedDataset& ids, const IndexedDataset& labels, int64_t doc,
                             TrainingSample* out) const {
  const int64_t length = ids.sequence_lengths()[doc];
  thread_local std::vector<int32_t> id_buf, label_buf;
  id_buf.resize(static_cast<size_t>(length));
  label_buf.resize(static_cast<size_t>(length));
  GALE_RETURN_IF_ERROR(ids.read(doc, 0, length, id_buf.data()));
  GALE_RETURN_IF_ERROR(labels.read(doc, 0, length, label_buf.data()));
  Status s = assemble_instruction_sample(id_buf, label_buf, {}, o_, out);
  if (!s.ok()) return Status(s.code(), str_cat(ids.prefix(), ": document ", doc, ": ", s.message()));
  return Status::Ok();
}

Status PairwiseDataset::get(int64_t index, TrainingSample* out) const {
  if (index < 0 || index >= size()) return OutOfRange("pair ", index, " of ", size());
  return read(*sources_->chosen_input_ids, *sources_->chosen_labels, order_[static_cast<size_t>(index)], out);
}

Status PairwiseDataset::get_pair(int64_t index, TrainingSample* chosen, TrainingSample* rejected) const {
  if (index < 0 || index >= size()) return OutOfRange("pair ", index, " of ", size());
  const int64_t doc = order_[static_cast<size_t>(index)];
  GALE_RETURN_IF_ERROR(read(*sources_->chosen_input_ids, *sources_->chosen_labels, doc, chosen));
  return read(*sources_->rejected_input_ids, *sources_->rejected_labels, doc, rejected);
}

}  // namespace gale
