// MindSpeed-LLM's SharegptStyleInstructionHandler input: ShareGPT records (a list of role-tagged
// messages) turned into the conversation the chat templates encode (convert_sharegpt_to_intermediate).
//
// Record: {"conversations": [{"from": "human", "value": "..."}, {"from": "gpt", "value": "..."}, ...],
//          "system": "..." (only when mapped), "tools": "..." (only when mapped)}
// --map-keys '{"messages": "conversations", "system": "system", "tools": "tools",
//              "tags": {"role_tag": "from", "content_tag": "value", "user_tag": "human",
//                       "assistant_tag": "gpt", "observation_tag": "observation",
//                       "function_tag": "function_call", "system_tag": "system"}}'
// (the defaults; a "tags" object replaces all seven, a tag it leaves out is unset, as
// LLaMA-Factory's set_attr).
//
// Rules (MindSpeed-LLM): a first message with the system tag is the system text (else the mapped
// system column, else the template's default); the messages must then alternate user/observation
// at even positions and assistant/function at odd ones, and be an even number; a message without
// the content tag is left out (its count may then break the pairing). A record that breaks these
// rules, or has no messages, is skipped (counted as "without a response", as MindSpeed-LLM's
// filter drops it). The last message is the response, the others the prompt (history).
// Not supported (one-line errors naming the record): observation or function messages and a
// non-empty tools column (their templates' tool formatting), content that is not a string.
#pragma once

#include <string>

#include "core/status.h"
#include "data/instruction_preprocess.h"

namespace gale {

struct SharegptColumns {
  std::string messages = "conversations", system, tools;  // "" = not read
  std::string role_tag = "from", content_tag = "value", user_tag = "human", assistant_tag = "gpt",
              observation_tag = "observation", function_tag = "function_call", system_tag = "system";
};

// Parses --map-keys for SharegptStyleInstructionHandler (keys messages, system, tools, tags).
StatusOr<SharegptColumns> parse_sharegpt_map_keys(const std::string& json_text);

// One record as a conversation; no messages when the record is skipped (header comment). Errors
// (without file/line): not a JSON object, no messages column, wrong types, unsupported roles.
StatusOr<InstructionConversation> sharegpt_to_conversation(const std::string& line, const SharegptColumns& columns);

}  // namespace gale
