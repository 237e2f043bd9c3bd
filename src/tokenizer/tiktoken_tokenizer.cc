// TikTokenizer: Megatron's tiktoken JSON vocabulary, special-token block and rank-based BPE.
#include "tokenizer/tiktoken_tokenizer.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "tokenizer/byte_level.h"

namespace gale {

bool base64_decode(std::string_view text, std::string* out) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  out->clear();
  if (text.size() % 4 != 0) return false;
  for (size_t i = 0; i < text.size(); i += 4) {
    bool last = i + 4 == text.size();
    int pad = last ? (text[i + 3] == '=') + (text[i + 2] == '=' && text[i + 3] == '=') : 0;
    uint32_t bits = 0;
    for (int k = 0; k < 4; ++k) {
      int v = k >= 4 - pad ? 0 : value(text[i + static_cast<size_t>(k)]);
      if (v < 0) return false;
      bits = (bits << 6) | static_cast<uint32_t>(v);
    }
    out->push_back(static_cast<char>(bits >> 16));
    if (pad < 2) out->push_back(static_cast<char>((bits >> 8) & 0xFF));
    if (pad < 1) out->push_back(static_cast<char>(bits & 0xFF));
  }
  return true;
}

StatusOr<std::unique_ptr<TikTokenizer>> TikTokenizer::load(const std::string& path, const TiktokenOptions& options) {
  if (path.empty())
    return InvalidArgument("--tokenizer-model is required for TikTokenizer (the tokenizer's .json vocabulary)");
  if (path.size() < 5 || path.compare(path.size() - 5, 5, ".json") != 0)
    return InvalidArgument("--tokenizer-model ", path, ": TikTokenizer expects a .json vocabulary file (Megatron's ",
                           "list of {rank, token_bytes, token_str}), found another file name");
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("--tokenizer-model ", path, ": cannot open file");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse(ss.str(), "--tokenizer-model " + path, options);
}

StatusOr<std::unique_ptr<TikTokenizer>> TikTokenizer::parse(std::string_view json_text, const std::string& name,
                                                            const TiktokenOptions& o) {
  std::unique_ptr<TikTokenizer> t(new TikTokenizer());
  t->file_ = name;
  if (o.pattern == "v1") {
    t->pattern_ = SplitPattern::kTiktokenV1;
  } else if (o.pattern == "v2") {
    t->pattern_ = SplitPattern::kTiktokenV2;
  } else {
    return InvalidArgument("--tiktoken-pattern: TikTokenizer needs v1 or v2, found '", o.pattern, "'");
  }
  t->pattern_name_ = o.pattern;
  const int64_t vocab_size = o.vocab_size > 0 ? o.vocab_size : int64_t{1} << 17;  // Megatron's fallback
  const int64_t n_special = o.num_special_tokens;
  std::vector<std::string> specials = o.special_tokens;
  if (specials.empty()) specials = {"<unk>", "<s>", "</s>"};
  if (std::set<std::string>(specials.begin(), specials.end()).size() != specials.size())
    return InvalidArgument("--tiktoken-special-tokens: the special tokens must be unique");
  for (const char* required : {"<unk>", "<s>", "</s>"})
    if (std::find(specials.begin(), specials.end(), required) == specials.end())
      return InvalidArgument("--tiktoken-special-tokens: the list must include <unk>, <s> and </s>, found no ",
                             required);
  if (static_cast<int64_t>(specials.size()) > n_special || n_special >= vocab_size)
    return InvalidArgument("--tiktoken-num-special-tokens: expected ", specials.size(),
                           " (the special tokens given) <= N < the vocabulary size ", vocab_size, ", found N = ",
                           n_special);
  for (int64_t k = static_cast<int64_t>(specials.size()); k < n_special; ++k)
    specials.push_back(str_cat("<SPECIAL_", k, ">"));
  const int64_t inner = vocab_size - n_special;
  if (inner < 256)
    return InvalidArgument("--vocab-size ", vocab_size, " minus --tiktoken-num-special-tokens ", n_special, " leaves ",
                           inner, " ranks: TikTokenizer needs at least the 256 single-byte tokens");

  nlohmann::json j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_array())
    return InvalidArgument(name, ": expected Megatron's TikTokenizer vocabulary (a JSON list of {rank, token_bytes, ",
                           "token_str}), found ", j.is_discarded() ? "text that is not JSON" : "other JSON");
  if (static_cast<int64_t>(j.size()) < inner)
    return InvalidArgument(name, ": holds ", j.size(), " tokens, but --vocab-size ", vocab_size, " minus ", n_special,
                           " special tokens needs ", inner);
  StringIdMap ranks;  // token bytes -> rank
  std::vector<std::string> rank_bytes(static_cast<size_t>(inner));
  std::string bytes;
  for (int64_t r = 0; r < inner; ++r) {
    const nlohmann::json& e = j[static_cast<size_t>(r)];
    if (!e.is_object() || e.size() != 3 || !e.contains("rank") || !e.contains("token_bytes") ||
        !e.contains("token_str"))
      return InvalidArgument(name, ": entry ", r, " is ", e.dump().substr(0, 80),
                             ", expected exactly the keys rank, token_bytes and token_str");
    if (!e["rank"].is_number_integer() || e["rank"].get<int64_t>() != r)
      return InvalidArgument(name, ": entry ", r, " has rank ", e["rank"].dump(), ", expected ", r);
    if (!e["token_bytes"].is_string() || !base64_decode(e["token_bytes"].get<std::string>(), &bytes) || bytes.empty())
      return InvalidArgument(name, ": entry ", r, ": token_bytes ", e["token_bytes"].dump().substr(0, 40),
                             " is not non-empty base64");
    if (r < 256 && bytes != std::string(1, static_cast<char>(r)))
      return InvalidArgument(name, ": rank ", r, " must be the single byte ", r, " (the first 256 ranks are the bytes)");
    if (!ranks.emplace(bytes, static_cast<int32_t>(r)).second)
      return InvalidArgument(name, ": rank ", r, " repeats the bytes of rank ", ranks.find(bytes)->second);
    rank_bytes[static_cast<size_t>(r)] = bytes;
  }

  // Ids: the special block first, then the ranks shifted by it.
  t->num_special_ = n_special;
  t->id_to_bytes_ = specials;
  t->id_to_bytes_.insert(t->id_to_bytes_.end(), rank_bytes.begin(), rank_bytes.end());
  for (const std::string& s : specials)
    if (ranks.count(s))
      return InvalidArgument(name, ": the special token ", s, " is also an ordinary token (rank ", ranks.find(s)->second,
                             "); Megatron requires them to be distinct");
  auto position = [&](const char* s) {
    return static_cast<int32_t>(std::find(specials.begin(), specials.end(), s) - specials.begin());
  };
  t->unk_ = position("<unk>");
  t->bos_ = position("<s>");
  t->eos_ = position("</s>");

  // Rank-based BPE as merges: every split of a token into two tokens merges into it at its rank.
  StringIdMap vocab;
  for (const auto& [b, r] : ranks) vocab.emplace(b, static_cast<int32_t>(r + n_special));
  std::vector<std::pair<std::string, std::string>> merges;
  std::vector<int32_t> merge_ranks;
  for (int64_t r = 256; r < inner; ++r) {
    const std::string& tok = rank_bytes[static_cast<size_t>(r)];
    for (size_t cut = 1; cut < tok.size(); ++cut) {
      std::string_view left(tok.data(), cut), right(tok.data() + cut, tok.size() - cut);
      if (ranks.count(left) && ranks.count(right)) {
        merges.emplace_back(std::string(left), std::string(right));
        merge_ranks.push_back(static_cast<int32_t>(r));
      }
    }
  }
  BpeOptions bpe;
  bpe.byte_level = true;
  bpe.ignore_merges = true;  // tiktoken emits a piece that is itself a token as that token
  GALE_ASSIGN_OR_RETURN(t->bpe_, BpeModel::create(vocab, merges, bpe, name, &merge_ranks));
  return t;
}

Status TikTokenizer::encode(std::string_view text, std::vector<int32_t>* ids) const {
  GALE_RETURN_IF_ERROR(check_utf8(text));
  thread_local std::vector<uint32_t> ends;
  ends.clear();
  pretokenize(pattern_, text, &ends);
  uint32_t start = 0;
  for (uint32_t end : ends) {
    bpe_->encode_word(text.substr(start, end - start), ids);
    start = end;
  }
  return Status::Ok();
}

StatusOr<std::string> TikTokenizer::decode(std::span<const int32_t> ids) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= id_to_bytes_.size())
      return OutOfRange("TikTokenizer: id ", id, " is outside the vocabulary of ", id_to_bytes_.size());
    bytes += id_to_bytes_[static_cast<size_t>(id)];
  }
  return utf8_lossy(bytes);
}

std::string TikTokenizer::describe() const {
  return str_cat("TikTokenizer (", file_, ", pattern ", pattern_name_, "): vocabulary ", vocab_size(), " (",
                 num_special_, " special), bos ", bos_, ", eod ", eos_);
}

}  // namespace gale
