// `gale generate --task chat`: MindSpeed-LLM's interactive chat. Each user line becomes a prompt
// through the --prompt-type chat template with the last --history-turns exchanges before it.
//
// With a template, the prompt is the conversation (kept history, the new user message, an empty
// assistant message) encoded as `gale preprocess --handler-name ...` encodes it
// (data/chat_template.h: each pair's source then target), without the last, empty, target: it
// ends where the assistant's answer starts. The kept history is at most `history_turns` earlier
// (user, assistant) pairs (MindSpeed-LLM: drop the oldest pair once more than that are kept).
// Without a template the prompt is the plain text of the kept exchanges followed by the user line.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "data/chat_template.h"

namespace gale {

struct ChatSession {
  bool use_template = false;
  ChatTemplate chat_template;
  TemplateTokenizer tokenizer;  // template slots -> ids
  EncodeFn encode_text;         // without a template: the plain text -> ids
  int64_t history_turns = 3;    // --history-turns
  std::vector<ChatMessage> history;  // alternating user, assistant; oldest first
};

// The prompt ids for the next user message.
StatusOr<std::vector<int32_t>> chat_prompt(const ChatSession& s, const std::string& user);

// Keeps the exchange (dropping the oldest beyond history_turns).
void chat_remember(ChatSession& s, const std::string& user, const std::string& assistant);

}  // namespace gale
