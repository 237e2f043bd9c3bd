// Chat prompts from the template and the kept history (see the header).
#include "train/chat.h"

#include <limits>

namespace gale {

StatusOr<std::vector<int32_t>> chat_prompt(const ChatSession& s, const std::string& user) {
  std::vector<int32_t> ids;
  if (!s.use_template) {
    std::string text;
    for (const ChatMessage& m : s.history) text += m.content;
    text += user;
    Status st = s.encode_text(text, &ids);
    if (!st.ok()) return st;
    return ids;
  }
  std::vector<ChatMessage> messages = s.history;
  messages.push_back({true, user});
  messages.push_back({false, ""});
  std::vector<EncodedTurn> turns;
  Status st = encode_conversation(s.chat_template, s.tokenizer, messages, "",
                                  std::numeric_limits<int32_t>::max(), &turns);
  if (!st.ok()) return st;
  for (size_t i = 0; i < turns.size(); ++i) {
    ids.insert(ids.end(), turns[i].source.begin(), turns[i].source.end());
    if (i + 1 < turns.size()) ids.insert(ids.end(), turns[i].target.begin(), turns[i].target.end());
  }
  return ids;
}

void chat_remember(ChatSession& s, const std::string& user, const std::string& assistant) {
  s.history.push_back({true, user});
  s.history.push_back({false, assistant});
  while (static_cast<int64_t>(s.history.size()) > 2 * s.history_turns) s.history.erase(s.history.begin(), s.history.begin() + 2);
}

}  // namespace gale
