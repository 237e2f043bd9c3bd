// Megatron-LM's SFTTokenizer prompt formats and tokenize_conversation (see the header).
#include "data/sft_conversation.h"

#include <algorithm>

#include "tokenizer/unicode.h"

namespace gale {
namespace {

// Python's str.isspace() code points.
bool python_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

std::string replace_all(std::string text, std::string_view from) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at)) text.erase(at, from.size());
  return text;
}

std::string render_one(SftPromptFormat f, const SftMessage& m) {
  const std::string& role = m.role;
  switch (f) {
    case SftPromptFormat::kNemotronHAligned:
      if (role == "system") return "<SPECIAL_10>System\n" + python_strip(m.content) + "\n";
      if (role == "user") return "<SPECIAL_11>User\n" + python_strip(m.content) + "\n<SPECIAL_11>Assistant\n";
      if (role == "assistant") return python_strip(m.content) + "\n";
      return "";
    case SftPromptFormat::kNemotronNanoV2: {
      const std::string cleaned = replace_all(replace_all(m.content, "/think"), "/no_think");
      if (role == "system") return "<SPECIAL_10>System\n" + python_strip(cleaned) + "\n";
      if (role == "user") return "<SPECIAL_11>User\n" + python_strip(cleaned) + "\n";
      if (role == "assistant") return "<SPECIAL_11>Assistant\n" + python_strip(m.content) + "\n<SPECIAL_12>\n";
      return "";
    }
    case SftPromptFormat::kIdentity:
      return m.content;
  }
  return "";
}

}  // namespace

StatusOr<SftPromptFormat> parse_sft_prompt_format(const std::string& name) {
  if (name == "nemotron-h-aligned") return SftPromptFormat::kNemotronHAligned;
  if (name == "nemotron-nano-v2") return SftPromptFormat::kNemotronNanoV2;
  if (name == "identity") return SftPromptFormat::kIdentity;
  if (name == "default")
    return Unimplemented("--sft-tokenizer-prompt-format default: not supported yet (it renders the tokenizer's own "
                         "Jinja chat_template); Gale has nemotron-h-aligned, nemotron-nano-v2 and identity");
  return InvalidArgument("--sft-tokenizer-prompt-format: expected nemotron-h-aligned, nemotron-nano-v2, identity or "
                         "default, found '",
                         name, "'");
}

std::string python_strip(std::string_view text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  size_t begin = text.size(), end = 0;
  for (size_t i = 0; i < text.size();) {
    int len = 1;
    const uint32_t cp = decode_utf8(p + i, &len);
    if (!python_space(cp)) {
      begin = std::min(begin, i);
      end = i + static_cast<size_t>(len);
    }
    i += static_cast<size_t>(len);
  }
  return begin < end ? std::string(text.substr(begin, end - begin)) : std::string();
}

std::string render_sft_messages(SftPromptFormat format, std::span<const SftMessage> messages) {
  std::string out;
  for (const SftMessage& m : messages) out += render_one(format, m);
  return out;
}

std::vector<std::vector<SftMessage>> split_sft_conversations(std::span<const SftMessage> messages) {
  std::vector<std::vector<SftMessage>> out;
  std::vector<SftMessage> current;
  for (const SftMessage& m : messages) {
    if (m.role == "system" && !current.empty()) out.push_back(std::move(current)), current.clear();
    current.push_back(m);
  }
  if (!current.empty()) out.push_back(std::move(current));
  return out;
}

StatusOr<SftTokenizer> SftTokenizer::create(const HuggingFaceTokenizer* tokenizer, SftPromptFormat format) {
  SftTokenizer t;
  t.tokenizer_ = tokenizer;
  t.format_ = format;
  const char* pad_token = format == SftPromptFormat::kNemotronHAligned ? "<SPECIAL_233>" : "<unk>";
  t.assistant_prefix_len_ = format == SftPromptFormat::kNemotronNanoV2 ? 3 : 0;
  t.pad_ = tokenizer->token_id(pad_token);
  if (t.pad_ < 0) t.pad_ = tokenizer->unk_token_id();
  if (t.pad_ < 0)
    return InvalidArgument("--sft-tokenizer-prompt-format: the format pads with the token ", pad_token,
                           ", which the tokenizer has not, and it has no unk_token to stand for it");
  return t;
}

Status SftTokenizer::tokenize_conversation(std::span<const SftMessage> conversation, std::vector<int32_t>* tokens,
                                           std::vector<int32_t>* targets) const {
  tokens->clear();
  GALE_RETURN_IF_ERROR(tokenizer_->encode_plain(render_sft_messages(format_, conversation), tokens));
  *targets = *tokens;
  const size_t n = tokens->size();
  size_t idx = 0;
  std::vector<int32_t> turn_tokens;
  for (size_t t = 0; t < conversation.size(); ++t) {
    const SftMessage& turn = conversation[t];
    const bool assistant = turn.role == "assistant";
    if (assistant && turn.content.empty()) return InvalidArgument("empty assistant turn in conversation");
    if (assistant) {
      const std::string& prev = (t == 0 ? conversation.back() : conversation[t - 1]).role;
      if (prev != "user" && prev != "tool")
        return InvalidArgument("an assistant turn must follow a user or tool turn, found one after '", prev, "'");
    }
    turn_tokens.clear();
    GALE_RETURN_IF_ERROR(tokenizer_->encode_plain(render_sft_messages(format_, conversation.subspan(t, 1)),
                                                  &turn_tokens));
    const size_t len = turn_tokens.size();
    const size_t lo = std::min(idx, n), hi = std::min(idx + len, n);
    if (!assistant) {
      std::fill(targets->begin() + static_cast<std::ptrdiff_t>(lo), targets->begin() + static_cast<std::ptrdiff_t>(hi),
                kSftIgnoreIndex);
    } else if (assistant_prefix_len_ > 0) {
      const size_t end = std::min(idx + static_cast<size_t>(assistant_prefix_len_), n);
      std::fill(targets->begin() + static_cast<std::ptrdiff_t>(lo), targets->begin() + static_cast<std::ptrdiff_t>(end),
                kSftIgnoreIndex);
    }
    const auto at = tokens->begin() + static_cast<std::ptrdiff_t>(lo);
    if (hi - lo != len || !std::equal(turn_tokens.begin(), turn_tokens.end(), at))
      return InvalidArgument("turn ", t, " (", turn.role,
                             ") tokenizes differently alone than inside its conversation (Megatron's "
                             "tokenize_conversation asserts they match; the tokenizer merges across the turn "
                             "boundary)");
    idx += len;
  }
  if (idx != n)
    return InvalidArgument("the turns hold ", idx, " tokens, the whole conversation ", n,
                           " (Megatron's tokenize_conversation asserts they match)");
  return Status::Ok();
}

}  // namespace gale
