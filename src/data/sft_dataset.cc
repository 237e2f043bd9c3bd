// Megatron-LM main's SFTDataset: JSONL conversations packed into samples (see the header).
#include "data/sft_dataset.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "data/jsonl_reader.h"

namespace gale {
namespace {

Status parse_messages(const std::string& line, std::vector<SftMessage>* out) {
  nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
  if (j.is_discarded()) return InvalidArgument("malformed JSON");
  if (!j.is_object()) return InvalidArgument("expected a JSON object");
  if (!j.contains("messages") || !j["messages"].is_array())
    return InvalidArgument("expected \"messages\": a list of {\"role\", \"content\"} objects");
  for (const auto& m : j["messages"]) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
        !m["content"].is_string())
      return InvalidArgument("expected every message to be an object with string \"role\" and \"content\", found ",
                             m.dump());
    SftMessage msg{m["role"].get<std::string>(), m["content"].get<std::string>()};
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant" && msg.role != "tool")
      return InvalidArgument("expected role system, user, assistant or tool, found '", msg.role, "'");
    out->push_back(std::move(msg));
  }
  return Status::Ok();
}

class SftDataset : public SampleDataset {
 public:
  SftDataset(std::shared_ptr<const SftRecords> records, std::shared_ptr<const HuggingFaceTokenizer> hf,
             const SftTokenizer& tokenizer, int64_t begin, int64_t end, int64_t num_samples, const SftSampleOptions& o)
      : records_(std::move(records)), hf_(std::move(hf)), tokenizer_(tokenizer), begin_(begin), end_(end),
        num_samples_(num_samples), o_(o) {}
  int64_t size() const override { return num_samples_; }
  Status get(int64_t index, TrainingSample* out) const override {
    if (index < 0 || index >= num_samples_)
      return OutOfRange("--sft: sample ", index, " out of range [0, ", num_samples_, ")");
    const int64_t line = begin_ + index % (end_ - begin_);
    SftSample sample;
    Status s = pack_sft_sample(tokenizer_, records_->lines[static_cast<size_t>(line)], o_, &sample);
    if (!s.ok())
      return InvalidArgument(records_->path, ":", records_->line_numbers[static_cast<size_t>(line)], ": --sft sample ",
                             index, ": ", s.message());
    sft_training_sample(sample, out);
    return Status::Ok();
  }

 private:
  std::shared_ptr<const SftRecords> records_;
  std::shared_ptr<const HuggingFaceTokenizer> hf_;  // keeps tokenizer_'s tokenizer alive
  SftTokenizer tokenizer_;
  int64_t begin_, end_, num_samples_;
  SftSampleOptions o_;
};

}  // namespace

StatusOr<std::shared_ptr<const SftRecords>> SftRecords::load(const std::string& path) {
  GALE_ASSIGN_OR_RETURN(auto reader, JsonlReader::open(path));
  auto records = std::make_shared<SftRecords>();
  records->path = path;
  std::string line;
  while (true) {
    GALE_ASSIGN_OR_RETURN(bool more, reader->next_line(&line));
    if (!more) break;
    if (is_blank_line(line)) continue;
    std::vector<SftMessage> messages;
    Status s = parse_messages(line, &messages);
    if (!s.ok()) return InvalidArgument(path, ":", reader->line_number(), ": --sft: ", s.message());
    records->lines.push_back(std::move(messages));
    records->line_numbers.push_back(reader->line_number());
  }
  return std::shared_ptr<const SftRecords>(std::move(records));
}

Status pack_sft_sample(const SftTokenizer& tokenizer, std::span<const SftMessage> messages, const SftSampleOptions& o,
                       SftSample* out) {
  const int64_t S = o.seq_length;
  const int32_t pad = tokenizer.pad();
  std::vector<int32_t> tokens, targets, positions, cu{0};
  auto extend_with_padding = [&](int64_t n) -> Status {
    if (positions.empty()) return InvalidArgument("the line has no tokens to pad (Megatron fails on positions[-1])");
    const int32_t next = positions.back() + 1;
    tokens.insert(tokens.end(), static_cast<size_t>(n), pad);
    targets.insert(targets.end(), static_cast<size_t>(n), pad);
    for (int64_t i = 0; i < n; ++i) positions.push_back(next + static_cast<int32_t>(i));
    return Status::Ok();
  };
  std::vector<int32_t> conv_tokens, conv_targets;
  for (const auto& conversation : split_sft_conversations(messages)) {
    GALE_RETURN_IF_ERROR(tokenizer.tokenize_conversation(conversation, &conv_tokens, &conv_targets));
    tokens.insert(tokens.end(), conv_tokens.begin(), conv_tokens.end());
    targets.insert(targets.end(), conv_targets.begin(), conv_targets.end());
    for (size_t i = 0; i < conv_tokens.size(); ++i) positions.push_back(static_cast<int32_t>(i));
    if (o.context_parallel_size > 1) {
      const int64_t granularity = 2 * o.context_parallel_size;
      const int64_t mod = static_cast<int64_t>(tokens.size()) % granularity;
      if (mod != 0) GALE_RETURN_IF_ERROR(extend_with_padding(granularity - mod));
    }
    cu.push_back(static_cast<int32_t>(tokens.size()));
    if (static_cast<int64_t>(tokens.size()) >= S + 1) {  // cut on the right, one pad to align the labels
      tokens.resize(static_cast<size_t>(S));
      targets.resize(static_cast<size_t>(S));
      tokens.push_back(pad);
      targets.push_back(pad);
      positions.resize(static_cast<size_t>(S + 1));
      cu.back() = static_cast<int32_t>(S);
      break;
    }
  }
  if (static_cast<int64_t>(tokens.size()) < S + 1) {
    GALE_RETURN_IF_ERROR(extend_with_padding(S + 1 - static_cast<int64_t>(tokens.size())));
    cu.back() = static_cast<int32_t>(S);
  }
  out->tokens.assign(tokens.begin(), tokens.end() - 1);
  out->labels.assign(targets.begin() + 1, targets.end());
  out->position_ids.assign(positions.begin(), positions.end() - 1);
  out->loss_mask.assign(static_cast<size_t>(S), 1.0f);
  for (int64_t i = 0; i < S; ++i)
    if (out->labels[static_cast<size_t>(i)] == pad || out->labels[static_cast<size_t>(i)] == kSftIgnoreIndex)
      out->loss_mask[static_cast<size_t>(i)] = 0.0f;
  out->cu_seqlens = cu;
  out->max_seqlen = 0;
  for (size_t i = 1; i < cu.size(); ++i) out->max_seqlen = std::max(out->max_seqlen, cu[i] - cu[i - 1]);
  return Status::Ok();
}

void sft_training_sample(const SftSample& sample, TrainingSample* out) {
  const size_t S = sample.tokens.size();
  out->tokens = sample.tokens;
  out->labels = sample.labels;
  for (int32_t& label : out->labels)
    if (label == kSftIgnoreIndex) label = 0;  // its loss mask is 0
  out->loss_mask = sample.loss_mask;
  out->position_ids = sample.position_ids;
  out->document_ids.assign(S, 0);
  int32_t document = -1;
  for (size_t k = 0; k + 1 < sample.cu_seqlens.size(); ++k) {
    const size_t lo = static_cast<size_t>(sample.cu_seqlens[k]), hi = static_cast<size_t>(sample.cu_seqlens[k + 1]);
    if (hi <= lo) continue;  // an empty segment
    ++document;
    std::fill(out->document_ids.begin() + static_cast<std::ptrdiff_t>(lo),
              out->document_ids.begin() + static_cast<std::ptrdiff_t>(std::min(hi, S)), document);
  }
  out->unpadded_length = 0;
}

std::unique_ptr<SampleDataset> make_sft_dataset(std::shared_ptr<const SftRecords> records,
                                                std::shared_ptr<const HuggingFaceTokenizer> tokenizer,
                                                const SftTokenizer& sft_tokenizer, int64_t begin, int64_t end,
                                                int64_t num_samples, const SftSampleOptions& options) {
  return std::make_unique<SftDataset>(std::move(records), std::move(tokenizer), sft_tokenizer, begin, end, num_samples,
                                      options);
}

}  // namespace gale
