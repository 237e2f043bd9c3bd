// The legacy split, the shuffled document order and the samples of instruction datasets.
#include "data/instruction_dataset.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "data/instruction_preprocess.h"
#include "data/numpy_random.h"

namespace gale {

StatusOr<std::array<int64_t, 4>> legacy_split_bounds(const std::string& split, int64_t n) {
  char sep = split.find(',') != std::string::npos ? ',' : (split.find('/') != std::string::npos ? '/' : '\0');
  std::vector<double> w;
  std::stringstream in(split);
  std::string part;
  while (sep ? std::getline(in, part, sep) : std::getline(in, part)) {
    try {
      size_t used = 0;
      w.push_back(std::stod(part, &used));
      if (part.find_first_not_of(" \t", used) != std::string::npos) throw std::invalid_argument(part);
    } catch (const std::exception&) {
      return InvalidArgument("--split: expected numbers separated by ',' or '/', found '", split, "'");
    }
    if (!sep) break;
  }
  while (w.size() < 3) w.push_back(0.0);
  w.resize(3);
  double sum = w[0] + w[1] + w[2];
  if (!(sum > 0.0) || w[0] < 0 || w[1] < 0 || w[2] < 0)
    return InvalidArgument("--split: expected non-negative weights with a positive sum, found '", split, "'");
  std::array<int64_t, 4> b{0, 0, 0, 0};
  for (int i = 0; i < 3; ++i)
    b[i + 1] = b[i] + static_cast<int64_t>(std::nearbyint(w[i] / sum * static_cast<double>(n)));  // half to even
  const int64_t diff = b[3] - n;
  for (int i = 1; i < 4; ++i) b[i] -= diff;
  return b;
}

std::vector<int64_t> instruction_sample_order(int64_t begin, int64_t end, int64_t num_samples, uint32_t seed,
                                              bool shuffle) {
  std::vector<int64_t> order;
  if (end <= begin) return order;
  NumpyRandomState rng(seed);
  std::vector<int64_t> epoch(static_cast<size_t>(end - begin));
  while (static_cast<int64_t>(order.size()) < num_samples) {
    for (int64_t i = begin; i < end; ++i) epoch[static_cast<size_t>(i - begin)] = i;
    if (shuffle) rng.shuffle(epoch.data(), static_cast<int64_t>(epoch.size()));
    order.insert(order.end(), epoch.begin(), epoch.end());
  }
  return order;
}

StatusOr<std::shared_ptr<const InstructionSources>> InstructionSources::open(const std::string& prefix, bool mmap) {
  auto s = std::make_shared<InstructionSources>();
  s->prefix = prefix;
  std::vector<std::string> names = instruction_dataset_prefixes(prefix);
  GALE_ASSIGN_OR_RETURN(s->input_ids, IndexedDataset::open(names[0], mmap));
  GALE_ASSIGN_OR_RETURN(s->attention_mask, IndexedDataset::open(names[1], mmap));
  GALE_ASSIGN_OR_RETURN(s->labels, IndexedDataset::open(names[2], mmap));
  for (const IndexedDataset* d : {s->input_ids.get(), s->attention_mask.get(), s->labels.get()}) {
    if (d->dtype() != TokenDType::kInt32)
      return DataLoss("--data-path ", d->prefix(), ": expected int32 ids (MindSpeed-LLM's instruction datasets), "
                      "found ",
                      token_dtype_name(d->dtype()));
    if (d->num_sequences() != s->input_ids->num_sequences())
      return DataLoss("--data-path ", prefix, ": ", d->prefix(), " has ", d->num_sequences(), " sequences but ",
                      names[0], " has ", s->input_ids->num_sequences());
  }
  for (int64_t i = 0; i < s->input_ids->num_sequences(); ++i)
    for (const IndexedDataset* d : {s->attention_mask.get(), s->labels.get()})
      if (s->input_ids->sequence_lengths()[i] != d->sequence_lengths()[i])
        return DataLoss("--data-path ", prefix, ": sample ", i, " has ", s->input_ids->sequence_lengths()[i],
                        " input ids but ", d->sequence_lengths()[i], " entries in ", d->prefix());
  return std::shared_ptr<const InstructionSources>(std::move(s));
}

Status assemble_instruction_sample(std::span<const int32_t> input_ids, std::span<const int32_t> labels,
                                   std::span<const int32_t> attention_mask, const InstructionSampleOptions& o,
                                   TrainingSample* out) {
  const int64_t S = o.seq_length, L = static_cast<int64_t>(input_ids.size());
  if (L > S)
    return FailedPrecondition("a sample has ", L, " tokens, more than --seq-length ", S,
                              " (preprocess with --seq-length ", S, " or less)");
  for (int64_t i = 0; i < L; ++i) {
    if (input_ids[i] < 0 || (o.vocab_size > 0 && input_ids[i] >= o.vocab_size))
      return DataLoss("token id ", input_ids[i], " at position ", i, " is outside the tokenizer's vocabulary [0, ",
                      o.vocab_size, "); was the dataset made with another tokenizer?");
    if (labels[i] != kIgnoreLabel && (labels[i] < 0 || (o.vocab_size > 0 && labels[i] >= o.vocab_size)))
      return DataLoss("label ", labels[i], " at position ", i, " is neither -100 nor a token id");
  }
  out->tokens.resize(S);
  out->labels.resize(S);
  out->loss_mask.resize(S);
  out->position_ids.resize(S);
  out->document_ids.assign(S, 0);
  for (int64_t i = 0; i < S; ++i) {
    const int32_t token = i < L ? input_ids[i] : o.pad;
    const int32_t label = i + 1 < L ? labels[i + 1] : kIgnoreLabel;
    out->tokens[i] = token < 0 ? 0 : token;
    out->labels[i] = label == kIgnoreLabel ? 0 : label;
    out->loss_mask[i] = label == kIgnoreLabel ? 0.0f : 1.0f;
    out->position_ids[i] = static_cast<int32_t>(i);
  }
  out->unpadded_length = L;
  if (o.reset_attention_mask) {
    // Documents (and position runs) of the stored ids; the padding after them keeps the last ones.
    // Neat packs: sample k (mask k) is document k - 1 and the pack's padding (mask 0) one more
    // after the last sample, so that the ids never decrease.
    int32_t doc = 0, position = 0, samples = 0;
    for (int64_t i = 0; i < S; ++i) {
      bool padding = false;
      if (i < L && o.neat_pack) {
        const int32_t m = attention_mask[i];
        if (m < 0 || (m > 0 && m < samples) || (m > samples + 1) || (m > 0 && i > 0 && attention_mask[i - 1] == 0))
          return DataLoss("attention mask value ", m, " at position ", i,
                          ": a --neat-pack mask numbers the samples 1, 2, ... in order, then 0 on the padding");
        if (i > 0 && m != attention_mask[i - 1]) position = 0;
        samples = std::max(samples, m);
        padding = m == 0;
        doc = padding ? samples : m - 1;
      }
      out->document_ids[i] = doc;
      if (o.reset_position_ids) out->position_ids[i] = padding ? 0 : position;
      ++position;
      if (!o.neat_pack && i < L && input_ids[i] == o.eos) {  // a new document after each EOS
        ++doc;
        position = 0;
      }
    }
  }
  return Status::Ok();
}

namespace {
class InstructionDataset : public SampleDataset {
 public:
  InstructionDataset(std::shared_ptr<const InstructionSources> s, std::vector<int64_t> order,
                     const InstructionSampleOptions& o)
      : sources_(std::move(s)), order_(std::move(order)), o_(o) {}
  int64_t size() const override { return static_cast<int64_t>(order_.size()); }
  Status get(int64_t index, TrainingSample* out) const override {
    if (index < 0 || index >= size()) return OutOfRange("sample ", index, " of ", size());
    const int64_t doc = order_[static_cast<size_t>(index)];
    const int64_t length = sources_->input_ids->sequence_lengths()[doc];
    thread_local std::vector<int32_t> ids, labels, mask;
    ids.resize(static_cast<size_t>(length));
    labels.resize(static_cast<size_t>(length));
    mask.resize(o_.neat_pack ? static_cast<size_t>(length) : 0);
    GALE_RETURN_IF_ERROR(sources_->input_ids->read(doc, 0, length, ids.data()));
    GALE_RETURN_IF_ERROR(sources_->labels->read(doc, 0, length, labels.data()));
    if (o_.neat_pack) GALE_RETURN_IF_ERROR(sources_->attention_mask->read(doc, 0, length, mask.data()));
    Status s = assemble_instruction_sample(ids, labels, mask, o_, out);
    if (!s.ok()) return Status(s.code(), str_cat(sources_->prefix, ": document ", doc, ": ", s.message()));
    return Status::Ok();
  }

 private:
  std::shared_ptr<const InstructionSources> sources_;
  std::vector<int64_t> order_;
  InstructionSampleOptions o_;
};
}  // namespace

std::unique_ptr<SampleDataset> make_instruction_dataset(std::shared_ptr<const InstructionSources> sources,
                                                        std::vector<int64_t> order,
                                                        const InstructionSampleOptions& options) {
  return std::make_unique<InstructionDataset>(std::move(sources), std::move(order), options);
}

}  // namespace gale
