// BoolQ and HellaSwag records as multiple-choice items (see the header).
#include "train/evaluate_choice_tasks.h"

#include <nlohmann/json.hpp>

namespace gale {

namespace {

StatusOr<std::string> text_field(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return InvalidArgument("expected a string field \"", key, "\"");
  return it->get<std::string>();
}

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (size_t at = 0; (at = s.find(from, at)) != std::string::npos; at += to.size()) s.replace(at, from.size(), to);
}

}  // namespace

std::string hellaswag_preprocess(const std::string& text) {
  const size_t first = text.find_first_not_of(" \t\r\n"), last = text.find_last_not_of(" \t\r\n");
  std::string s = first == std::string::npos ? "" : text.substr(first, last - first + 1);
  replace_all(s, " [title]", ". ");
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {  // [anything] (shortest) removed
    const size_t close = s[i] == '[' ? s.find(']', i) : std::string::npos;
    if (close != std::string::npos) {
      i = close;
      continue;
    }
    out += s[i];
  }
  replace_all(out, "  ", " ");
  return out;
}

StatusOr<ChoiceItem> parse_choice_item(const std::string& task, const std::string& line) {
  nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgument("expected a JSON object");
  ChoiceItem item;
  if (task == "boolq") {
    GALE_ASSIGN_OR_RETURN(std::string passage, text_field(j, "passage"));
    GALE_ASSIGN_OR_RETURN(std::string question, text_field(j, "question"));
    auto answer = j.find("answer");
    if (answer == j.end() || !answer->is_boolean()) return InvalidArgument("expected a boolean field \"answer\"");
    item.context = passage + "\nQuestion: " + question + "?\nAnswer:";
    item.continuations = {" no", " yes"};
    item.answer = answer->get<bool>() ? 1 : 0;
    return item;
  }
  std::string ctx;
  if (j.contains("ctx_a")) {
    GALE_ASSIGN_OR_RETURN(std::string a, text_field(j, "ctx_a"));
    GALE_ASSIGN_OR_RETURN(std::string b, text_field(j, "ctx_b"));
    if (!b.empty() && b[0] >= 'a' && b[0] <= 'z') b[0] = static_cast<char>(b[0] - 'a' + 'A');
    ctx = a + " " + b;
  } else {
    GALE_ASSIGN_OR_RETURN(ctx, text_field(j, "ctx"));
  }
  GALE_ASSIGN_OR_RETURN(std::string activity, text_field(j, "activity_label"));
  auto endings = j.find("endings");
  if (endings == j.end() || !endings->is_array() || endings->size() < 2)
    return InvalidArgument("expected an array \"endings\" of at least two strings");
  for (const auto& e : *endings) {
    if (!e.is_string()) return InvalidArgument("expected an array \"endings\" of at least two strings");
    item.continuations.push_back(" " + hellaswag_preprocess(e.get<std::string>()));
  }
  auto label = j.find("label");
  int64_t answer = -1;
  if (label != j.end() && label->is_number_integer()) answer = label->get<int64_t>();
  if (label != j.end() && label->is_string()) {
    const std::string s = label->get<std::string>();
    if (!s.empty() && s.find_first_not_of("0123456789") == std::string::npos) answer = std::stoll(s);
  }
  if (answer < 0 || answer >= static_cast<int64_t>(item.continuations.size()))
    return InvalidArgument("expected \"label\" to index \"endings\" (0 to ", item.continuations.size() - 1, ")");
  item.context = hellaswag_preprocess(activity + ": " + ctx);
  item.answer = static_cast<int>(answer);
  return item;
}

int64_t utf8_length(const std::string& s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

int argmax_per_character(const std::vector<double>& scores, const std::vector<std::string>& continuations) {
  int best = 0;
  for (size_t i = 1; i < scores.size(); ++i)
    if (scores[i] / static_cast<double>(utf8_length(continuations[i])) >
        scores[best] / static_cast<double>(utf8_length(continuations[best])))
      best = static_cast<int>(i);
  return best;
}

}  // namespace gale
