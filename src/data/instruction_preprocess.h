// `gale preprocess --handler-name AlpacaStyleInstructionHandler`: MindSpeed-LLM's instruction
// (supervised fine-tuning) preprocessing of Alpaca records into three indexed datasets.
//
// Record -> conversation (convert_alpaca_to_intermediate): with --map-keys columns (defaults
// prompt=instruction, query=input, response=output; system and history only when mapped):
// history pairs [[user, assistant], ...] become alternating messages; then one user message
// "prompt\nquery" (each part only when not empty); then the response (a string, or a list of
// strings: one message each). A record without a response (null or an empty list) is skipped
// without a trace, as align_dataset filters it; one with several responses becomes one empty
// user and one empty assistant message, as in MindSpeed-LLM. The system text (mapped column,
// else the template's default) goes through the chat template (data/chat_template.h).
//
// Ids and labels (LlamaFactoryInstructionHandler._tokenize_prompt): the turns of
// encode_conversation(cutoff_len = seq_length) are concatenated; user ids get label -100 (with
// efficient_eos the first id of every user turn after the first is labelled EOS instead);
// assistant ids are their own labels; efficient_eos appends EOS, --append-eod appends the EOD
// (both labelled with themselves). Attention mask: all ones. With --neat-pack each turn is first
// cut again to fit seq_length - 1 (_infer_seqlen, below), as MindSpeed-LLM does there.
//
// Output (BaseDatasetHandler._serialize_to_disk): PREFIX_packed_{input_ids,attention_mask,labels}
// _document.bin/.idx, int32, one sequence per record. A record whose ids number seq_length or
// more is dropped (counted); like MindSpeed-LLM it still closes a document, so the .idx holds an
// empty document there and the sequence count is the number of records kept. --pack: below.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "data/chat_template.h"

namespace gale {

inline constexpr int32_t kIgnoreLabel = -100;  // MindSpeed-LLM's IGNORE_INDEX

// --map-keys: which JSON keys hold the Alpaca fields ("" = not read).
struct AlpacaColumns {
  std::string prompt = "instruction", query = "input", response = "output", system, history;
};
// Parses --map-keys '{"prompt":"instruction",...}' (keys prompt, query, response, system, history).
StatusOr<AlpacaColumns> parse_map_keys(const std::string& json_text);

// One record turned into a conversation and its system text (no messages: the record has no
// response and is skipped). Errors (without file/line): not a
// JSON object, a missing prompt or response key, a value of the wrong type.
struct InstructionConversation {
  std::vector<ChatMessage> messages;
  std::string system;
};
StatusOr<InstructionConversation> alpaca_to_conversation(const std::string& line, const AlpacaColumns& columns);

struct InstructionSample {
  std::vector<int32_t> input_ids, attention_mask, labels;
  bool cut = false;  // --neat-pack shortened a turn to fit seq_length - 1
};
// The ids and labels of one conversation (the header comment). `eod` < 0: no --append-eod.
StatusOr<InstructionSample> tokenize_conversation(const ChatTemplate& t, const TemplateTokenizer& tok,
                                                  const InstructionConversation& c, int64_t seq_length, int32_t eod,
                                                  bool neat_pack = false);

// LLaMA-Factory's _infer_seqlen: the {source, target} lengths after cutting a turn to `cutoff`.
// If 2·target < cutoff only the source is cut; else if 2·source < cutoff only the target; else
// the target keeps int(cutoff · target / (source + target)) and the source the rest.
std::pair<int64_t, int64_t> infer_seqlen(int64_t source_len, int64_t target_len, int64_t cutoff);

// One input line -> its conversation (alpaca_to_conversation, sharegpt_to_conversation in
// data/sharegpt_records.h); no messages: the record is skipped.
using RecordConverter = std::function<StatusOr<InstructionConversation>(const std::string& line)>;

struct InstructionPreprocessOptions {
  std::string input;          // .jsonl (or .jsonl.gz)
  std::string output_prefix;  // "_packed_<key>_document" is appended
  RecordConverter convert;    // the handler's record format
  ChatTemplate chat_template;
  int64_t seq_length = 0;
  bool append_eod = false;
  int64_t log_interval = 1000;
  // --pack (BaseDatasetHandler._pack_serialize_to_disk): the kept samples' lengths are packed by
  // greedy_knapsack into capacity seq_length - 1 (sorted lengths; each pack repeatedly takes the
  // largest length that still fits); each pack concatenates, for its lengths in the order taken,
  // the most recent not yet used sample of that length, then is padded to seq_length (input ids
  // with `pad`, attention mask 1, labels -100): one sequence of seq_length per pack, no empty
  // documents for dropped samples.
  bool pack = false;
  // --neat-pack (with --pack): samples of seq_length ids or more are cut to seq_length - 1 instead
  // of dropped, and each pack's attention mask numbers its samples 1, 2, ... in pack order, with 0
  // on the padding: training with --neat-pack --reset-attention-mask keeps attention inside each
  // sample (data/instruction_dataset.h).
  bool neat_pack = false;
  int32_t pad = -1;
};

struct InstructionPreprocessStats {
  int64_t records = 0;  // non-blank lines read
  int64_t written = 0;  // sequences written (packs with --pack)
  int64_t dropped = 0;  // records of seq_length ids or more
  int64_t cut = 0;      // --neat-pack: records cut to fit seq_length - 1 (instead of dropped)
  int64_t filtered = 0;  // records without a response (skipped, no document)
  int64_t tokens = 0;   // input ids written
  std::vector<std::string> outputs;  // the three prefixes
};

// The three dataset prefixes for --output-prefix P: P_packed_{input_ids,attention_mask,labels}_document.
std::vector<std::string> instruction_dataset_prefixes(const std::string& output_prefix);

// Reads, converts, tokenizes and writes; errors name the input file and line (and the key).
// Nothing is left behind on error.
StatusOr<InstructionPreprocessStats> run_instruction_preprocess(const InstructionPreprocessOptions& options,
                                                                const TemplateTokenizer& tok, std::FILE* log);

}  // namespace gale
