// MindSpeed-LLM's AlpacaStylePairwiseHandler (data/pairwise_preprocess.h).
#include "data/pairwise_preprocess.h"

#include <memory>
#include <nlohmann/json.hpp>

#include "data/indexed_dataset.h"
#include "data/jsonl_reader.h"
#include "data/pairwise_dataset.h"

namespace gale {

using nlohmann::json;

namespace {
// The response column alpaca_to_conversation reads: filled here with the chosen or rejected text.
constexpr const char* kResponseSlot = "\x01gale_pair_response";
}  // namespace

StatusOr<PairwiseColumns> parse_pairwise_map_keys(const std::string& json_text) {
  PairwiseColumns c;
  json j = json::parse(json_text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return InvalidArgument("--map-keys: expected a JSON object such as '{\"prompt\":\"instruction\"}', found '",
                           json_text, "'");
  for (const char* key : {"chosen", "rejected"}) {
    if (!j.contains(key)) continue;
    if (!j[key].is_string() || j[key].get<std::string>().empty())
      return InvalidArgument("--map-keys: the value of '", key, "' must be a column name (a string)");
    (std::string(key) == "chosen" ? c.chosen : c.rejected) = j[key].get<std::string>();
    j.erase(key);
  }
  j.erase("response");  // accepted, unused by the pairwise handler
  GALE_ASSIGN_OR_RETURN(AlpacaColumns a, parse_map_keys(j.dump()));
  c.alpaca = a;
  return c;
}

StatusOr<PairwiseConversation> alpaca_to_pairwise(const std::string& line, const PairwiseColumns& c) {
  json record = json::parse(line, nullptr, false);
  if (record.is_discarded()) return InvalidArgument("malformed JSON");
  if (!record.is_object()) return InvalidArgument("expected a JSON object, found ", record.type_name());
  PairwiseConversation out;
  auto text_of = [&](const std::string& key, size_t list_index, std::string* text) -> StatusOr<bool> {
    auto it = record.find(key);
    if (it == record.end() || it->is_null()) return false;
    if (it->is_string()) {
      *text = it->get<std::string>();
      return true;
    }
    if (it->is_array()) {
      if (it->size() <= list_index || !(*it)[list_index].is_string())
        return InvalidArgument("key '", key, "': expected a string or a list with a string at index ", list_index,
                               " (MindSpeed-LLM reads chosen[0] and rejected[1])");
      *text = (*it)[list_index].get<std::string>();
      return true;
    }
    return InvalidArgument("key '", key, "': expected a string or a list of strings, found ", it->type_name());
  };
  std::string chosen, rejected;
  GALE_ASSIGN_OR_RETURN(bool has_chosen, text_of(c.chosen, 0, &chosen));
  GALE_ASSIGN_OR_RETURN(bool has_rejected, text_of(c.rejected, 1, &rejected));
  if (!record.contains(c.alpaca.prompt)) return InvalidArgument("missing key '", c.alpaca.prompt, "'");
  if (!has_chosen || !has_rejected) return out;  // no responses: filtered
  AlpacaColumns columns = c.alpaca;
  columns.response = kResponseSlot;
  record[kResponseSlot] = chosen;
  GALE_ASSIGN_OR_RETURN(out.chosen, alpaca_to_conversation(record.dump(), columns));
  record[kResponseSlot] = rejected;
  GALE_ASSIGN_OR_RETURN(out.rejected, alpaca_to_conversation(record.dump(), columns));
  return out;
}

StatusOr<PairwiseSample> tokenize_pair(const ChatTemplate& t, const TemplateTokenizer& tok,
                                       const PairwiseConversation& pair) {
  constexpr int64_t kNoCutoff = int64_t{1} << 40;  // encode_oneturn truncates nothing
  PairwiseSample out;
  std::vector<int32_t> prompt;
  for (int side = 0; side < 2; ++side) {
    const InstructionConversation& c = side == 0 ? pair.chosen : pair.rejected;
    std::vector<EncodedTurn> turns;
    GALE_RETURN_IF_ERROR(encode_conversation(t, tok, c.messages, c.system, kNoCutoff, &turns));
    if (turns.empty()) return InvalidArgument("the record encodes to no turns");
    std::vector<int32_t> p;
    for (size_t i = 0; i + 1 < turns.size(); ++i) {
      p.insert(p.end(), turns[i].source.begin(), turns[i].source.end());
      p.insert(p.end(), turns[i].target.begin(), turns[i].target.end());
    }
    p.insert(p.end(), turns.back().source.begin(), turns.back().source.end());
    std::vector<int32_t> response = turns.back().target;
    if (t.efficient_eos) response.push_back(tok.eos);
    if (side == 0) prompt = p;  // MindSpeed-LLM uses the chosen encoding's prompt for both
    std::vector<int32_t>& ids = side == 0 ? out.chosen_input_ids : out.rejected_input_ids;
    std::vector<int32_t>& labels = side == 0 ? out.chosen_labels : out.rejected_labels;
    ids = prompt;
    ids.insert(ids.end(), response.begin(), response.end());
    labels.assign(prompt.size(), kIgnoreLabel);
    labels.insert(labels.end(), response.begin(), response.end());
  }
  return out;
}

StatusOr<PairwisePreprocessStats> run_pairwise_preprocess(const PairwisePreprocessOptions& o,
                                                          const TemplateTokenizer& tok, std::FILE* log) {
  if (o.seq_length < 1) return InvalidArgument("--seq-length: expected a positive integer, found ", o.seq_length);
  if (o.output_prefix.empty()) return InvalidArgument("--output-prefix is required");
  GALE_ASSIGN_OR_RETURN(auto reader, JsonlReader::open(o.input));
  PairwisePreprocessStats stats;
  stats.outputs = pairwise_dataset_prefixes(o.output_prefix);
  std::vector<std::unique_ptr<IndexedDatasetWriter>> writers;
  for (const std::string& prefix : stats.outputs) {
    GALE_ASSIGN_OR_RETURN(auto w, IndexedDatasetWriter::create(prefix, TokenDType::kInt32));
    writers.push_back(std::move(w));
  }
  std::string line;
  while (true) {
    GALE_ASSIGN_OR_RETURN(bool more, reader->next_line(&line));
    if (!more) break;
    if (is_blank_line(line)) continue;
    ++stats.records;
    auto where = [&](const Status& s) {
      return Status(s.code(), str_cat(o.input, ":", reader->line_number(), ": ", s.message()));
    };
    auto pair = alpaca_to_pairwise(line, o.columns);
    if (!pair.ok()) return where(pair.status());
    if (pair->chosen.messages.empty()) {
      ++stats.filtered;
      continue;
    }
    auto sample = tokenize_pair(o.chat_template, tok, *pair);
    if (!sample.ok()) return where(sample.status());
    const std::vector<int32_t>* parts[4] = {&sample->chosen_input_ids, &sample->chosen_labels,
                                            &sample->rejected_input_ids, &sample->rejected_labels};
    if (static_cast<int64_t>(sample->chosen_input_ids.size()) >= o.seq_length ||
        static_cast<int64_t>(sample->rejected_input_ids.size()) >= o.seq_length) {
      ++stats.dropped;
      for (auto& w : writers) GALE_RETURN_IF_ERROR(w->add_document({}, {}));  // an empty document, as MindSpeed-LLM
      continue;
    }
    for (int i = 0; i < 4; ++i) {
      const int32_t lengths[1] = {static_cast<int32_t>(parts[i]->size())};
      GALE_RETURN_IF_ERROR(writers[static_cast<size_t>(i)]->add_document(*parts[i], lengths));
    }
    ++stats.written;
    if (log && o.log_interval > 0 && stats.records % o.log_interval == 0)
      std::fprintf(log, "Processed %lld documents.\n", static_cast<long long>(stats.records));
  }
  for (auto& w : writers) GALE_RETURN_IF_ERROR(w->finalize());
  return stats;
}

}  // namespace gale
