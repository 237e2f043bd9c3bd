// Instruction records (Alpaca, ShareGPT) -> chat-template ids and labels -> the three packed instruction datasets.
#include "data/instruction_preprocess.h"

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <nlohmann/json.hpp>

#include "data/indexed_dataset.h"
#include "data/jsonl_reader.h"

namespace gale {

using nlohmann::json;

StatusOr<AlpacaColumns> parse_map_keys(const std::string& json_text) {
  AlpacaColumns c;
  json j = json::parse(json_text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return InvalidArgument("--map-keys: expected a JSON object such as '{\"prompt\":\"instruction\"}', found '",
                           json_text, "'");
  for (auto it = j.begin(); it != j.end(); ++it) {
    std::string* field = nullptr;
    if (it.key() == "prompt") field = &c.prompt;
    if (it.key() == "query") field = &c.query;
    if (it.key() == "response") field = &c.response;
    if (it.key() == "system") field = &c.system;
    if (it.key() == "history") field = &c.history;
    if (!field)
      return InvalidArgument("--map-keys: expected keys among prompt, query, response, system, history, found '",
                             it.key(), "'");
    if (it.value().is_null()) {
      field->clear();
    } else if (it.value().is_string()) {
      *field = it.value().get<std::string>();
    } else {
      return InvalidArgument("--map-keys: the value of '", it.key(), "' must be a column name (a string)");
    }
  }
  if (c.prompt.empty()) return InvalidArgument("--map-keys: 'prompt' must name a column");
  if (c.response.empty()) return InvalidArgument("--map-keys: 'response' must name a column");
  return c;
}

namespace {

// The text of key `key`: "" when the key is absent or null (optional keys), an error otherwise.
Status optional_text(const json& record, const std::string& key, std::string* out) {
  out->clear();
  if (key.empty()) return Status::Ok();
  auto it = record.find(key);
  if (it == record.end() || it->is_null()) return Status::Ok();
  if (!it->is_string()) return InvalidArgument("key '", key, "': expected a string, found ", it->type_name());
  *out = it->get<std::string>();
  return Status::Ok();
}

}  // namespace

StatusOr<InstructionConversation> alpaca_to_conversation(const std::string& line, const AlpacaColumns& c) {
  json record = json::parse(line, nullptr, false);
  if (record.is_discarded()) return InvalidArgument("malformed JSON");
  if (!record.is_object()) return InvalidArgument("expected a JSON object, found ", record.type_name());
  for (const std::string* required : {&c.prompt, &c.response})
    if (!record.contains(*required)) return InvalidArgument("missing key '", *required, "'");

  InstructionConversation conv;
  std::vector<ChatMessage> prompt;
  if (!c.history.empty() && record.contains(c.history) && !record[c.history].is_null()) {
    const json& h = record[c.history];
    if (!h.is_array()) return InvalidArgument("key '", c.history, "': expected a list of [user, assistant] pairs");
    for (const json& pair : h) {
      if (!pair.is_array() || pair.size() != 2 || !pair[0].is_string() || !pair[1].is_string())
        return InvalidArgument("key '", c.history, "': expected a list of [user, assistant] pairs of strings, found ",
                               pair.dump());
      prompt.push_back({true, pair[0].get<std::string>()});
      prompt.push_back({false, pair[1].get<std::string>()});
    }
  }
  std::string instruction, query;
  GALE_RETURN_IF_ERROR(optional_text(record, c.prompt, &instruction));
  GALE_RETURN_IF_ERROR(optional_text(record, c.query, &query));
  std::string content = instruction;
  if (!query.empty()) content = instruction.empty() ? query : instruction + "\n" + query;
  prompt.push_back({true, content});

  std::vector<ChatMessage> response;
  const json& r = record[c.response];
  if (r.is_string()) {
    response.push_back({false, r.get<std::string>()});
  } else if (r.is_array()) {
    for (const json& e : r) {
      if (!e.is_string()) return InvalidArgument("key '", c.response, "': expected strings in the list");
      response.push_back({false, e.get<std::string>()});
    }
  } else if (!r.is_null()) {
    return InvalidArgument("key '", c.response, "': expected a string or a list of strings, found ", r.type_name());
  }
  GALE_RETURN_IF_ERROR(optional_text(record, c.system, &conv.system));

  if (response.empty()) return conv;  // no messages: align_dataset filters the record out
  if (prompt.size() % 2 != 1 || response.size() != 1) {
    conv.messages = {{true, ""}, {false, ""}};  // MindSpeed-LLM's replacement for an invalid conversation
  } else {
    conv.messages = std::move(prompt);
    conv.messages.push_back(response[0]);
  }
  return conv;
}

std::pair<int64_t, int64_t> infer_seqlen(int64_t source_len, int64_t target_len, int64_t cutoff) {
  int64_t max_target;
  if (target_len * 2 < cutoff) max_target = cutoff;
  else if (source_len * 2 < cutoff) max_target = cutoff - source_len;
  else  // Python's int() of the float product
    max_target = static_cast<int64_t>(static_cast<double>(cutoff) *
                                      (static_cast<double>(target_len) / static_cast<double>(source_len + target_len)));
  const int64_t target = std::min(max_target, target_len);
  const int64_t source = std::min(std::max<int64_t>(cutoff - target, 0), source_len);
  return {source, target};
}

StatusOr<InstructionSample> tokenize_conversation(const ChatTemplate& t, const TemplateTokenizer& tok,
                                                  const InstructionConversation& c, int64_t seq_length, int32_t eod,
                                                  bool neat_pack) {
  std::vector<EncodedTurn> turns;
  GALE_RETURN_IF_ERROR(encode_conversation(t, tok, c.messages, c.system, seq_length, &turns));
  InstructionSample s;
  for (const EncodedTurn& turn : turns) {
    const bool eos_label = !s.input_ids.empty() && t.efficient_eos;
    int64_t source_len = static_cast<int64_t>(turn.source.size()), target_len = static_cast<int64_t>(turn.target.size());
    if (neat_pack) {
      const auto [source_kept, target_kept] = infer_seqlen(source_len, target_len, seq_length - 1);
      s.cut = s.cut || source_kept < source_len || target_kept < target_len;
      source_len = source_kept;
      target_len = target_kept;
    }
    s.input_ids.insert(s.input_ids.end(), turn.source.begin(), turn.source.begin() + source_len);
    for (int64_t i = 0; i < source_len; ++i) s.labels.push_back(eos_label && i == 0 ? tok.eos : kIgnoreLabel);
    s.input_ids.insert(s.input_ids.end(), turn.target.begin(), turn.target.begin() + target_len);
    s.labels.insert(s.labels.end(), turn.target.begin(), turn.target.begin() + target_len);
  }
  if (t.efficient_eos) {
    s.input_ids.push_back(tok.eos);
    s.labels.push_back(tok.eos);
  }
  if (eod >= 0) {
    s.input_ids.push_back(eod);
    s.labels.push_back(eod);
  }
  if (s.input_ids.empty()) return InvalidArgument("the record encodes to no tokens");
  s.attention_mask.assign(s.input_ids.size(), 1);
  return s;
}

std::vector<std::string> instruction_dataset_prefixes(const std::string& output_prefix) {
  std::vector<std::string> out;
  for (const char* key : {"input_ids", "attention_mask", "labels"})
    out.push_back(output_prefix + "_packed_" + key + "_document");
  return out;
}

namespace {

// greedy_knapsack + the packing loop of _pack_serialize_to_disk (see the header).
Status write_packs(const std::vector<InstructionSample>& samples, const InstructionPreprocessOptions& o,
                   std::vector<std::unique_ptr<IndexedDatasetWriter>>& writers, InstructionPreprocessStats* stats) {
  std::multiset<int64_t> lengths;
  std::map<int64_t, std::vector<size_t>> by_length;
  for (size_t i = 0; i < samples.size(); ++i) {
    lengths.insert(static_cast<int64_t>(samples[i].input_ids.size()));
    by_length[static_cast<int64_t>(samples[i].input_ids.size())].push_back(i);
  }
  const int64_t capacity = o.seq_length - 1;
  while (!lengths.empty()) {
    InstructionSample pack;
    int32_t segment = 0;  // --neat-pack: the sample's number in the pack
    int64_t remaining = capacity;
    while (true) {
      auto it = lengths.upper_bound(remaining);
      if (it == lengths.begin()) break;
      --it;
      const int64_t length = *it;
      remaining -= length;
      lengths.erase(it);
      std::vector<size_t>& indices = by_length[length];
      const InstructionSample& s = samples[indices.back()];
      indices.pop_back();
      pack.input_ids.insert(pack.input_ids.end(), s.input_ids.begin(), s.input_ids.end());
      ++segment;
      if (o.neat_pack)
        pack.attention_mask.insert(pack.attention_mask.end(), s.attention_mask.size(), segment);
      else
        pack.attention_mask.insert(pack.attention_mask.end(), s.attention_mask.begin(), s.attention_mask.end());
      pack.labels.insert(pack.labels.end(), s.labels.begin(), s.labels.end());
    }
    const size_t used = pack.input_ids.size();
    pack.input_ids.resize(static_cast<size_t>(o.seq_length), o.pad);
    pack.attention_mask.resize(static_cast<size_t>(o.seq_length), o.neat_pack ? 0 : 1);
    pack.labels.resize(static_cast<size_t>(o.seq_length), kIgnoreLabel);
    const int32_t lengths_of_pack[1] = {static_cast<int32_t>(o.seq_length)};
    GALE_RETURN_IF_ERROR(writers[0]->add_document(pack.input_ids, lengths_of_pack));
    GALE_RETURN_IF_ERROR(writers[1]->add_document(pack.attention_mask, lengths_of_pack));
    GALE_RETURN_IF_ERROR(writers[2]->add_document(pack.labels, lengths_of_pack));
    ++stats->written;
    stats->tokens += static_cast<int64_t>(used);
  }
  return Status::Ok();
}

}  // namespace

StatusOr<InstructionPreprocessStats> run_instruction_preprocess(const InstructionPreprocessOptions& o,
                                                                const TemplateTokenizer& tok, std::FILE* log) {
  if (o.seq_length < 1) return InvalidArgument("--seq-length: expected a positive integer, found ", o.seq_length);
  if (o.output_prefix.empty()) return InvalidArgument("--output-prefix is required");
  if (!o.convert) return InvalidArgument("no record format (handler) given");
  if (o.append_eod && tok.eos < 0) return InvalidArgument("--append-eod: the tokenizer has no end-of-document token");
  if (o.pack && o.pad < 0) return InvalidArgument("--pack: the tokenizer has no pad or end token to pad packs with");
  if (o.neat_pack && !o.pack) return InvalidArgument("--neat-pack requires --pack (as MindSpeed-LLM)");
  GALE_ASSIGN_OR_RETURN(auto reader, JsonlReader::open(o.input));
  InstructionPreprocessStats stats;
  stats.outputs = instruction_dataset_prefixes(o.output_prefix);
  std::vector<std::unique_ptr<IndexedDatasetWriter>> writers;
  for (const std::string& prefix : stats.outputs) {
    GALE_ASSIGN_OR_RETURN(auto w, IndexedDatasetWriter::create(prefix, TokenDType::kInt32));
    writers.push_back(std::move(w));
  }
  std::vector<InstructionSample> kept;  // --pack only
  std::string line;
  while (true) {
    GALE_ASSIGN_OR_RETURN(bool more, reader->next_line(&line));
    if (!more) break;
    if (is_blank_line(line)) continue;
    ++stats.records;
    auto where = [&](const Status& s) {
      return Status(s.code(), str_cat(o.input, ":", reader->line_number(), ": ", s.message()));
    };
    auto conv = o.convert(line);
    if (!conv.ok()) return where(conv.status());
    if (conv->messages.empty()) {
      ++stats.filtered;  // no document at all, as MindSpeed-LLM's align_dataset filter
      continue;
    }
    auto sample = tokenize_conversation(o.chat_template, tok, *conv, o.seq_length, o.append_eod ? tok.eos : -1,
                                        o.neat_pack);
    if (!sample.ok()) return where(sample.status());
    int32_t length = static_cast<int32_t>(sample->input_ids.size());
    if (length >= o.seq_length && o.neat_pack) {  // cut, not dropped (_pack_serialize_to_disk)
      sample->cut = true;
      for (std::vector<int32_t>* v : {&sample->input_ids, &sample->attention_mask, &sample->labels})
        v->resize(static_cast<size_t>(o.seq_length - 1));
      length = static_cast<int32_t>(o.seq_length - 1);
    }
    stats.cut += sample->cut ? 1 : 0;
    if (length >= o.seq_length) {
      ++stats.dropped;
      if (!o.pack)
        for (auto& w : writers) GALE_RETURN_IF_ERROR(w->add_document({}, {}));  // an empty document, as MindSpeed-LLM
      continue;
    }
    if (o.pack) {
      kept.push_back(std::move(*sample));
      continue;
    }
    const int32_t lengths[1] = {length};
    GALE_RETURN_IF_ERROR(writers[0]->add_document(sample->input_ids, lengths));
    GALE_RETURN_IF_ERROR(writers[1]->add_document(sample->attention_mask, lengths));
    GALE_RETURN_IF_ERROR(writers[2]->add_document(sample->labels, lengths));
    ++stats.written;
    stats.tokens += length;
    if (log && o.log_interval > 0 && stats.records % o.log_interval == 0)
      std::fprintf(log, "Processed %lld documents.\n", static_cast<long long>(stats.records));
  }
  if (o.pack) GALE_RETURN_IF_ERROR(write_packs(kept, o, writers, &stats));
  for (auto& w : writers) GALE_RETURN_IF_ERROR(w->finalize());
  return stats;
}

}  // namespace gale
