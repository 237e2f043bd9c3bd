// ShareGPT records -> the conversation the chat templates encode (MindSpeed-LLM's rules).
#include "data/sharegpt_records.h"

#include <nlohmann/json.hpp>

namespace gale {

using nlohmann::json;

namespace {

// A column or tag name from --map-keys: a string, or null for "unset".
Status column_name(const std::string& key, const json& value, std::string* out) {
  if (value.is_null()) {
    out->clear();
    return Status::Ok();
  }
  if (!value.is_string()) return InvalidArgument("--map-keys: the value of '", key, "' must be a name (a string)");
  *out = value.get<std::string>();
  return Status::Ok();
}

}  // namespace

StatusOr<SharegptColumns> parse_sharegpt_map_keys(const std::string& json_text) {
  SharegptColumns c;
  json j = json::parse(json_text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return InvalidArgument("--map-keys: expected a JSON object such as '{\"messages\":\"conversations\"}', found '",
                           json_text, "'");
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "tags") {
      if (!it.value().is_object()) return InvalidArgument("--map-keys: 'tags' must be an object of tag names");
      const std::pair<const char*, std::string*> tags[] = {
          {"role_tag", &c.role_tag},           {"content_tag", &c.content_tag},     {"user_tag", &c.user_tag},
          {"assistant_tag", &c.assistant_tag}, {"observation_tag", &c.observation_tag},
          {"function_tag", &c.function_tag},   {"system_tag", &c.system_tag}};
      for (auto t = it.value().begin(); t != it.value().end(); ++t) {
        bool known = false;
        for (const auto& [name, field] : tags) known = known || t.key() == name;
        if (!known)
          return InvalidArgument("--map-keys: 'tags' has '", t.key(), "'; expected among role_tag, content_tag, ",
                                 "user_tag, assistant_tag, observation_tag, function_tag, system_tag");
      }
      for (const auto& [name, field] : tags)  // a tag the object leaves out is unset (LLaMA-Factory's set_attr)
        GALE_RETURN_IF_ERROR(column_name(name, it.value().contains(name) ? it.value()[name] : json(), field));
      continue;
    }
    std::string* field = it.key() == "messages" ? &c.messages
                         : it.key() == "system" ? &c.system
                         : it.key() == "tools"  ? &c.tools
                                                : nullptr;
    if (!field)
      return InvalidArgument("--map-keys: expected keys among messages, system, tools, tags, found '", it.key(), "'");
    GALE_RETURN_IF_ERROR(column_name(it.key(), it.value(), field));
  }
  if (c.messages.empty()) return InvalidArgument("--map-keys: 'messages' must name a column");
  if (c.role_tag.empty() || c.content_tag.empty())
    return InvalidArgument("--map-keys: 'tags' must name role_tag and content_tag");
  return c;
}

StatusOr<InstructionConversation> sharegpt_to_conversation(const std::string& line, const SharegptColumns& c) {
  json record = json::parse(line, nullptr, false);
  if (record.is_discarded()) return InvalidArgument("malformed JSON");
  if (!record.is_object()) return InvalidArgument("expected a JSON object, found ", record.type_name());
  auto m = record.find(c.messages);
  if (m == record.end()) return InvalidArgument("missing key '", c.messages, "'");
  if (!m->is_array()) return InvalidArgument("key '", c.messages, "': expected a list of messages");
  for (const json& message : *m)
    if (!message.is_object()) return InvalidArgument("key '", c.messages, "': expected message objects");
  auto text_of = [&](const json& obj, const std::string& key, std::string* out) -> Status {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return Status::Ok();
    if (!it->is_string()) return InvalidArgument("key '", key, "': expected a string, found ", it->type_name());
    *out = it->get<std::string>();
    return Status::Ok();
  };
  auto role_of = [&](const json& message) -> std::string {
    auto it = message.find(c.role_tag);
    return it != message.end() && it->is_string() ? it->get<std::string>() : std::string();
  };

  InstructionConversation conv;
  size_t first = 0;
  if (!c.system_tag.empty() && !m->empty() && role_of((*m)[0]) == c.system_tag) {
    GALE_RETURN_IF_ERROR(text_of((*m)[0], c.content_tag, &conv.system));
    first = 1;
  } else if (!c.system.empty()) {
    GALE_RETURN_IF_ERROR(text_of(record, c.system, &conv.system));
  }
  if (!c.tools.empty()) {
    std::string tools;
    GALE_RETURN_IF_ERROR(text_of(record, c.tools, &tools));
    if (!tools.empty())
      return Unimplemented("key '", c.tools, "': tool descriptions are not supported yet (the templates' tool format)");
  }
  bool broken = m->size() == first;
  std::vector<ChatMessage> messages;
  for (size_t i = first; i < m->size(); ++i) {
    const json& message = (*m)[i];
    const std::string role = role_of(message);
    const bool even = (i - first) % 2 == 0;  // user turns at even positions, assistant at odd ones
    if ((!c.observation_tag.empty() && role == c.observation_tag) || (!c.function_tag.empty() && role == c.function_tag))
      return Unimplemented("role '", role, "': observation and function messages are not supported yet");
    if (role != (even ? c.user_tag : c.assistant_tag) || role.empty()) broken = true;
    if (!message.contains(c.content_tag) || message[c.content_tag].is_null()) continue;  // left out
    std::string content;
    GALE_RETURN_IF_ERROR(text_of(message, c.content_tag, &content));
    messages.push_back({role == c.user_tag, content});
  }
  if (messages.size() % 2 != 0) broken = true;
  if (!broken) conv.messages = std::move(messages);
  return conv;
}

}  // namespace gale
