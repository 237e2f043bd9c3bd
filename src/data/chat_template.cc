// The chat templates of MindSpeed-LLM that Gale implements, and the turn encoding.
#include "data/chat_template.h"

#include <algorithm>

namespace gale {

namespace {

TemplateSlot text(std::string s) { return {TemplateSlot::kText, std::move(s)}; }
const TemplateSlot kBos{TemplateSlot::kBos, ""};
const TemplateSlot kEos{TemplateSlot::kEos, ""};

std::vector<ChatTemplate> all_templates() {
  std::vector<ChatTemplate> v;
  // Unset formatters take templates.py's defaults: system "{{content}}", assistant
  // "{{content}}" + EOS (no EOS with efficient_eos), no separator, no prefix.
  ChatTemplate empty;
  empty.name = "empty";
  empty.system = {text("{{content}}")};
  empty.user = {text("{{content}}")};
  empty.assistant = {text("{{content}}")};
  v.push_back(empty);

  ChatTemplate qwen;
  qwen.name = "qwen";
  qwen.user = {text("<|im_start|>user\n{{content}}<|im_end|>\n<|im_start|>assistant\n")};
  qwen.system = {text("<|im_start|>system\n{{content}}<|im_end|>\n")};
  qwen.assistant = {text("{{content}}"), kEos};
  qwen.separator = {text("\n")};
  qwen.default_system = "You are a helpful assistant.";
  qwen.replace_eos = "<|im_end|>";
  v.push_back(qwen);

  ChatTemplate llama3;
  llama3.name = "llama3";
  llama3.prefix = {kBos};
  llama3.user = {
      text("<|start_header_id|>user<|end_header_id|>\n\n{{content}}<|eot_id|>"
           "<|start_header_id|>assistant<|end_header_id|>\n\n")};
  llama3.system = {text("<|start_header_id|>system<|end_header_id|>\n\n{{content}}<|eot_id|>")};
  llama3.assistant = {text("{{content}}"), kEos};
  llama3.replace_eos = "<|eot_id|>";
  v.push_back(llama3);

  ChatTemplate alpaca;
  alpaca.name = "alpaca";
  alpaca.user = {text("### Instruction:\n{{content}}\n\n### Response:\n")};
  alpaca.system = {text("{{content}}")};
  alpaca.assistant = {text("{{content}}"), kEos};
  alpaca.separator = {text("\n\n")};
  alpaca.default_system =
      "Below is an instruction that describes a task. Write a response that appropriately completes the request.\n\n";
  v.push_back(alpaca);
  return v;
}

Status append_slots(const TemplateSlots& slots, const std::string& content, const TemplateTokenizer& tok,
                    std::vector<int32_t>* ids) {
  static const std::string kPlaceholder = "{{content}}";
  for (const TemplateSlot& s : slots) {
    if (s.kind == TemplateSlot::kBos) {
      if (tok.bos >= 0) ids->push_back(tok.bos);
    } else if (s.kind == TemplateSlot::kEos) {
      if (tok.eos >= 0) ids->push_back(tok.eos);
    } else {
      std::string t = s.text;
      size_t at = t.find(kPlaceholder);
      if (at != std::string::npos) t.replace(at, kPlaceholder.size(), content);
      if (!t.empty()) GALE_RETURN_IF_ERROR(tok.encode(t, ids));
    }
  }
  return Status::Ok();
}

}  // namespace

std::vector<std::string> chat_template_names() {
  std::vector<std::string> names;
  for (const auto& t : all_templates()) names.push_back(t.name);
  return names;
}

StatusOr<ChatTemplate> find_chat_template(const std::string& name) {
  std::string known;
  for (const auto& t : all_templates()) {
    if (t.name == name) return t;
    known += (known.empty() ? "" : ", ") + t.name;
  }
  return InvalidArgument("--prompt-type: expected one of ", known, ", found '", name, "'");
}

Status encode_conversation(const ChatTemplate& t, const TemplateTokenizer& tok,
                           const std::vector<ChatMessage>& messages,
                           const std::string& record_system, int64_t cutoff_len, std::vector<EncodedTurn>* turns) {
  if (messages.empty() || messages.size() % 2 != 0)
    return InvalidArgument("a conversation needs user/assistant pairs, found ", messages.size(), " messages");
  const std::string& system = record_system.empty() ? t.default_system : record_system;
  std::vector<std::vector<int32_t>> encoded(messages.size());
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].is_user != (i % 2 == 0))
      return InvalidArgument("message ", i, " should be a ", i % 2 == 0 ? "user" : "assistant", " message");
    std::vector<int32_t>& ids = encoded[i];
    if (i == 0) {
      GALE_RETURN_IF_ERROR(append_slots(t.prefix, "", tok, &ids));
      if (!system.empty()) GALE_RETURN_IF_ERROR(append_slots(t.system, system, tok, &ids));
    } else if (i % 2 == 0) {
      GALE_RETURN_IF_ERROR(append_slots(t.separator, "", tok, &ids));
    }
    GALE_RETURN_IF_ERROR(append_slots(messages[i].is_user ? t.user : t.assistant, messages[i].content, tok, &ids));
  }
  turns->clear();
  const int64_t reserved_label_len = 1;
  int64_t total = 0;
  for (size_t i = 0; i < encoded.size(); i += 2) {
    if (total >= cutoff_len) break;
    const int64_t source_len = static_cast<int64_t>(encoded[i].size());
    const int64_t target_len = static_cast<int64_t>(encoded[i + 1].size());
    const int64_t max_len = cutoff_len - total;
    int64_t max_target = 0;
    if (source_len + target_len != 0) {
      const double share = static_cast<double>(target_len) / static_cast<double>(source_len + target_len);
      max_target = static_cast<int64_t>(static_cast<double>(max_len) * share);  // Python's int(max_len * share)
    }
    max_target = std::max(max_target, reserved_label_len);
    const int64_t max_source = std::max<int64_t>(max_len - std::min(max_target, target_len), 0);  // >= 0 here
    EncodedTurn turn;
    turn.source.assign(encoded[i].begin(), encoded[i].begin() + std::min(max_source, source_len));
    turn.target.assign(encoded[i + 1].begin(), encoded[i + 1].begin() + std::min(max_target, target_len));
    total += static_cast<int64_t>(turn.source.size() + turn.target.size());
    turns->push_back(std::move(turn));
  }
  return Status::Ok();
}

}  // namespace gale
