// Megatron-LM's SFTTokenizer (megatron/core/tokenizers/text/libraries/sft_tokenizer.py): the
// --sft-tokenizer-prompt-format templates, tokenize_conversation's tokens and targets, and
// SFTDataset._split_conversations.
//
// Prompt formats (the Jinja templates Megatron renders through transformers' apply_chat_template,
// written out here; strip() is Python's str.strip, which removes Unicode whitespace):
//   nemotron-h-aligned (the default): system "<SPECIAL_10>System\n" + strip(c) + "\n";
//     user "<SPECIAL_11>User\n" + strip(c) + "\n<SPECIAL_11>Assistant\n"; assistant strip(c) + "\n";
//     tool nothing. Pad: the token <SPECIAL_233>. Assistant prefix masked: 0 tokens.
//   nemotron-nano-v2: system / user as above (user without the assistant header) after removing
//     "/think" and then "/no_think" from the content; assistant "<SPECIAL_11>Assistant\n" +
//     strip(c) + "\n<SPECIAL_12>\n"; tool nothing. Pad: <unk>. Assistant prefix masked: 3 tokens.
//   identity: every message's content as it is. Pad: <unk>. Assistant prefix masked: 0 tokens.
// A pad token the tokenizer lacks is its unk token (transformers' convert_tokens_to_ids), and an
// error when it has none. Megatron's fourth format, "default" (the tokenizer's own Jinja
// chat_template, all tokens trained), is not supported (a Jinja engine would be needed).
//
// tokenize_conversation: tokens = encode(render(conversation)) without the post-processor's
// special tokens (apply_chat_template tokenizes with add_special_tokens=False). targets = tokens,
// then turn by turn: each turn is rendered and encoded alone; its tokens must equal the next ones of
// the conversation (Megatron asserts this: a tokenizer that merges across a turn boundary fails);
// system, user and tool turns get target -100 (IGNORE_INDEX), an assistant turn keeps its targets
// except its first assistant_prefix_len ones. An empty assistant content is an error, and an
// assistant turn must follow a user or tool turn (for the first turn: the last one, Python's [-1]).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "tokenizer/hf_tokenizer.h"

namespace gale {

inline constexpr int32_t kSftIgnoreIndex = -100;

enum class SftPromptFormat { kNemotronHAligned, kNemotronNanoV2, kIdentity };

// "nemotron-h-aligned", "nemotron-nano-v2", "identity"; errors name --sft-tokenizer-prompt-format.
StatusOr<SftPromptFormat> parse_sft_prompt_format(const std::string& name);

struct SftMessage {
  std::string role;  // system, user, assistant or tool
  std::string content;
};

// Python's str.strip(): Unicode whitespace removed at both ends of UTF-8 text.
std::string python_strip(std::string_view text);

// The text the format's template renders for these messages.
std::string render_sft_messages(SftPromptFormat format, std::span<const SftMessage> messages);

// Conversations of one JSONL line: a new one starts at every system message.
std::vector<std::vector<SftMessage>> split_sft_conversations(std::span<const SftMessage> messages);

class SftTokenizer {
 public:
  // `tokenizer` must outlive the SftTokenizer.
  static StatusOr<SftTokenizer> create(const HuggingFaceTokenizer* tokenizer, SftPromptFormat format);
  int32_t pad() const { return pad_; }
  int32_t eod() const { return tokenizer_->eod(); }
  SftPromptFormat format() const { return format_; }
  // tokenize_conversation(conversation, return_target=True, add_generation_prompt=False).
  Status tokenize_conversation(std::span<const SftMessage> conversation, std::vector<int32_t>* tokens,
                               std::vector<int32_t>* targets) const;

 private:
  const HuggingFaceTokenizer* tokenizer_ = nullptr;
  SftPromptFormat format_ = SftPromptFormat::kNemotronHAligned;
  int32_t pad_ = -1;
  int assistant_prefix_len_ = 0;
};

}  // namespace gale
