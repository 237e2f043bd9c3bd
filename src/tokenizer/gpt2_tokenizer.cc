// GPT2BPETokenizer.
#include "tokenizer/gpt2_tokenizer.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tokenizer/byte_level.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/unicode.h"

namespace gale {

namespace {
StatusOr<std::string> read_whole(const std::string& path, const std::string& flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound(flag, " ", path, ": cannot open file");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
}  // namespace

StatusOr<std::vector<std::pair<std::string, std::string>>> parse_merges_txt(std::string_view text,
                                                                            const std::string& name) {
  std::vector<std::pair<std::string, std::string>> merges;
  size_t pos = 0;
  int64_t line_no = 0;
  while (pos <= text.size()) {
    size_t nl = text.find('\n', pos);
    std::string_view line = text.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos);
    pos = nl == std::string_view::npos ? text.size() + 1 : nl + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line_no == 1 && line.rfind("#version", 0) == 0) continue;
    if (line.empty()) continue;
    size_t sp = line.find(' ');
    if (sp == std::string_view::npos || sp == 0 || sp + 1 >= line.size() ||
        line.find(' ', sp + 1) != std::string_view::npos)
      return InvalidArgument(name, ":", line_no, ": expected a BPE merge 'left right', found '",
                             std::string(line.substr(0, 80)), "' (is this a GPT-2 merges.txt?)");
    merges.emplace_back(std::string(line.substr(0, sp)), std::string(line.substr(sp + 1)));
  }
  return merges;
}

StatusOr<std::unique_ptr<Gpt2BpeTokenizer>> Gpt2BpeTokenizer::load(const std::string& vocab_file,
                                                                   const std::string& merge_file) {
  if (vocab_file.empty()) return InvalidArgument("--vocab-file is required for GPT2BPETokenizer (GPT-2's vocab.json)");
  if (merge_file.empty()) return InvalidArgument("--merge-file is required for GPT2BPETokenizer (GPT-2's merges.txt)");
  GALE_ASSIGN_OR_RETURN(std::string vocab, read_whole(vocab_file, "--vocab-file"));
  GALE_ASSIGN_OR_RETURN(std::string merges, read_whole(merge_file, "--merge-file"));
  return parse(vocab, merges, "--vocab-file " + vocab_file, "--merge-file " + merge_file);
}

StatusOr<std::unique_ptr<Gpt2BpeTokenizer>> Gpt2BpeTokenizer::parse(std::string_view vocab_json,
                                                                    std::string_view merges_txt,
                                                                    const std::string& vocab_name,
                                                                    const std::string& merges_name) {
  nlohmann::json j = nlohmann::json::parse(vocab_json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return InvalidArgument(vocab_name, ": expected GPT-2's vocab.json (a JSON object mapping tokens to ids)",
                           j.is_discarded() ? ", found text that is not JSON" : ", found other JSON");
  if (j.contains("model") && j["model"].is_object())
    return InvalidArgument(vocab_name,
                           ": this is a Hugging Face tokenizer.json, not GPT-2's vocab.json; use "
                           "--tokenizer-type HuggingFaceTokenizer --tokenizer-model FILE");
  std::unique_ptr<Gpt2BpeTokenizer> t(new Gpt2BpeTokenizer());
  t->files_ = vocab_name + ", " + merges_name;
  StringIdMap vocab;
  std::string bytes;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!it.value().is_number_integer())
      return InvalidArgument(vocab_name, ": token '", it.key(), "' maps to ", it.value().dump(),
                             ", expected an integer id");
    int64_t id = it.value().get<int64_t>();
    if (id < 0 || id >= static_cast<int64_t>(j.size()))
      return InvalidArgument(vocab_name, ": ids are not 0..", j.size() - 1, " (found id ", id, ")");
    if (!byte_level_decode(it.key(), &bytes))
      return InvalidArgument(vocab_name, ": token '", it.key(), "' is not in GPT-2's byte-level alphabet");
    if (static_cast<size_t>(id) >= t->id_to_token_.size()) t->id_to_token_.resize(static_cast<size_t>(id) + 1);
    t->id_to_token_[static_cast<size_t>(id)] = bytes;
    vocab[bytes] = static_cast<int32_t>(id);
  }
  auto eod = j.find("<|endoftext|>");
  if (eod == j.end()) return InvalidArgument(vocab_name, ": no <|endoftext|> token (GPT2BPETokenizer uses it as EOD)");
  t->eod_ = eod.value().is_number_integer() ? eod.value().get<int32_t>() : -1;
  if (t->id_to_token_.size() != j.size())
    return InvalidArgument(vocab_name, ": ids are not 0..", j.size() - 1, " (found id ", t->id_to_token_.size() - 1,
                           ")");
  GALE_ASSIGN_OR_RETURN(auto merges_text, parse_merges_txt(merges_txt, merges_name));
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(merges_text.size());
  std::string a, b;
  for (size_t i = 0; i < merges_text.size(); ++i) {
    if (!byte_level_decode(merges_text[i].first, &a) || !byte_level_decode(merges_text[i].second, &b))
      return InvalidArgument(merges_name, ": merge ", i + 1, " is not in GPT-2's byte-level alphabet");
    merges.emplace_back(a, b);
  }
  BpeOptions options;
  options.byte_level = true;
  GALE_ASSIGN_OR_RETURN(t->bpe_, BpeModel::create(vocab, merges, options, merges_name));
  return t;
}

Status Gpt2BpeTokenizer::encode(std::string_view text, std::vector<int32_t>* ids) const {
  GALE_RETURN_IF_ERROR(check_utf8(text));
  thread_local std::vector<uint32_t> ends;
  ends.clear();
  pretokenize(SplitPattern::kGpt2, text, &ends);
  uint32_t start = 0;
  for (uint32_t end : ends) {
    bpe_->encode_word(text.substr(start, end - start), ids);
    start = end;
  }
  return Status::Ok();
}

StatusOr<std::string> Gpt2BpeTokenizer::decode(std::span<const int32_t> ids) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size())
      return OutOfRange("GPT2BPETokenizer: id ", id, " is outside the vocabulary of ", id_to_token_.size());
    bytes += id_to_token_[static_cast<size_t>(id)];
  }
  return utf8_lossy(bytes);
}

std::string Gpt2BpeTokenizer::describe() const {
  return str_cat("GPT2BPETokenizer (", files_, "): vocabulary ", vocab_size(), ", eod ", eod_);
}

}  // namespace gale
