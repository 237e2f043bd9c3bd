// `gale preprocess --handler-name AlpacaStylePairwiseHandler`: MindSpeed-LLM's preprocessing of
// Alpaca-style preference records (a prompt with a chosen and a rejected response) into the four
// pairwise datasets DPO trains on (data/pairwise_dataset.h).
//
// Record (convert_alpaca_to_intermediate with ranking): --map-keys names the columns prompt,
// query, system, history (as data/instruction_preprocess.h, same defaults) and chosen, rejected
// (defaults "chosen", "rejected"). The prompt messages are the history pairs, then one user message
// "prompt\nquery"; the chosen response is the chosen column when it is a string, or its first
// element when it is a list, and the rejected response the rejected column when a string, or its
// SECOND element when a list (MindSpeed-LLM's indices). A record whose chosen or rejected column is
// missing or null has no responses and is skipped (filtered).
//
// Ids (AlpacaStylePairwiseHandler._filter, Template.encode_oneturn without truncation): the prompt
// ids are every turn of the conversation before the last response (user and assistant slots, the
// system text in the first), the response ids the last assistant slot; with efficient_eos the EOS
// is appended to each response. chosen_input_ids = prompt + chosen, chosen_labels = -100 for every
// prompt id, then the chosen ids; the same for rejected. No --append-eod (the handler adds none).
//
// Output (BaseDatasetHandler._serialize_to_disk): PREFIX_packed_{chosen_input_ids,chosen_labels,
// rejected_input_ids,rejected_labels}_document.bin/.idx, int32, one document per record. A record
// whose chosen or rejected ids number --seq-length or more is dropped from all four (counted), each
// still closing an empty document, as MindSpeed-LLM.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "core/status.h"
#include "data/chat_template.h"
#include "data/instruction_preprocess.h"

namespace gale {

struct PairwiseColumns {
  AlpacaColumns alpaca;  // prompt, query, system, history (response unused)
  std::string chosen = "chosen", rejected = "rejected";
};
// --map-keys for the pairwise handler: keys prompt, query, response, system, history, chosen, rejected.
StatusOr<PairwiseColumns> parse_pairwise_map_keys(const std::string& json_text);

// One record: the conversation ending with the chosen response and the one ending with the
// rejected response (no messages in both: the record is skipped). Errors without file/line.
struct PairwiseConversation {
  InstructionConversation chosen, rejected;
};
StatusOr<PairwiseConversation> alpaca_to_pairwise(const std::string& line, const PairwiseColumns& columns);

struct PairwiseSample {
  std::vector<int32_t> chosen_input_ids, chosen_labels, rejected_input_ids, rejected_labels;
};
// The ids and labels of one pair (the header comment).
StatusOr<PairwiseSample> tokenize_pair(const ChatTemplate& t, const TemplateTokenizer& tok,
                                       const PairwiseConversation& pair);

struct PairwisePreprocessOptions {
  std::string input;          // .jsonl (or .jsonl.gz)
  std::string output_prefix;  // "_packed_<key>_document" is appended
  PairwiseColumns columns;
  ChatTemplate chat_template;
  int64_t seq_length = 0;
  int64_t log_interval = 1000;
};

struct PairwisePreprocessStats {
  int64_t records = 0;   // non-blank lines read
  int64_t written = 0;   // pairs written
  int64_t dropped = 0;   // pairs with a sequence of seq_length ids or more
  int64_t filtered = 0;  // records without chosen/rejected responses
  std::vector<std::string> outputs;  // the four prefixes
};

// Reads, converts, tokenizes and writes; errors name the input file and line. Nothing is left
// behind on error.
StatusOr<PairwisePreprocessStats> run_pairwise_preprocess(const PairwisePreprocessOptions& options,
                                                          const TemplateTokenizer& tok, std::FILE* log);

}  // namespace gale
