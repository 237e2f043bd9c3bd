// MindSpeed-LLM's chat templates (--prompt-type: configs/finetune/templates.json read by the plain
// Template class of mindspeed_llm/tasks/preprocess/templates.py) and their turn encoding.
//
// A conversation alternates user and assistant messages (user first). Message i is encoded as the
// ids of its elements, each string element tokenized on its own (add_special_tokens=False):
//   i == 0:         prefix slots, then the system slots (only when the system text is not empty;
//                   an empty record system falls back to the template's default system), then user
//   i even, i > 0:  separator slots, then user
//   i odd:          assistant slots
// Slots are texts with "{{content}}" (replaced once by the message or system text), or the
// tokenizer's BOS / EOS token (a BOS slot adds nothing when the tokenizer has no BOS).
//
// Pairs (user, assistant) are then cut to cutoff_len as Template._make_pairs does: for each pair
// while the running total is below cutoff_len, with max_len = cutoff_len - total,
//   max_target = max(int(max_len * target / (source + target)), 1)   (0 when both are empty)
//   max_source = max_len - min(max_target, target)
// and source[:max_source], target[:max_target] are kept.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "data/preprocess.h"

namespace gale {

struct TemplateSlot {
  enum Kind { kText, kBos, kEos } kind = kText;
  std::string text;  // kText only
};
using TemplateSlots = std::vector<TemplateSlot>;

struct ChatTemplate {
  std::string name;
  TemplateSlots prefix, system, user, assistant, separator;
  std::string default_system;
  bool efficient_eos = false;  // the assistant slots hold no EOS; one EOS ends the whole conversation
  std::string replace_eos;     // the stop word that becomes the tokenizer's EOS (MindSpeed's replace_eos), or ""
};

// The templates Gale implements: empty, qwen, llama3, alpaca. Unknown names: an error naming
// --prompt-type and listing them.
StatusOr<ChatTemplate> find_chat_template(const std::string& name);
std::vector<std::string> chat_template_names();

// How a template's slots become ids.
struct TemplateTokenizer {
  EncodeFn encode;   // text -> ids, without special tokens added around it
  int32_t bos = -1;  // -1: none
  int32_t eos = -1;  // after replace_eos
};

struct ChatMessage {
  bool is_user = true;
  std::string content;
};

// One (user, assistant) pair of a conversation after truncation.
struct EncodedTurn {
  std::vector<int32_t> source, target;
};

// Template._encode + _make_pairs (the header comment). `messages` must alternate user/assistant
// starting with a user message and have an even length.
Status encode_conversation(const ChatTemplate& t, const TemplateTokenizer& tok,
                           const std::vector<ChatMessage>& messages,
                           const std::string& system, int64_t cutoff_len, std::vector<EncodedTurn>* turns);

}  // namespace gale
