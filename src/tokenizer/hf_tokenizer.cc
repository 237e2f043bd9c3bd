// HuggingFaceTokenizer: tokenizer.json loading, added tokens, encode and decode.
#include "tokenizer/hf_tokenizer.h"

#include <algorithm>

#include <sys/stat.h>

#include <fstream>
#include <set>
#include <sstream>

#include "tokenizer/byte_level.h"
#include "tokenizer/unicode.h"

namespace gale {

namespace {
using json = nlohmann::json;

bool is_dir(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool read_file(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::stringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return true;
}

bool is_space_cp(uint32_t cp) { return char_class(cp) == CharClass::kSpace; }
bool is_word_cp(uint32_t cp) {
  CharClass c = char_class(cp);
  return c == CharClass::kLetter || c == CharClass::kNumber || cp == '_';
}

// Content of a special-token entry of tokenizer_config.json: "x" or {"content": "x", ...}.
std::string token_content(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string()) return j["content"].get<std::string>();
  return "";
}
}  // namespace

void HuggingFaceTokenizer::Matcher::add(const std::string& content, int index) {
  if (content.empty()) return;
  if (by_first_byte.empty()) by_first_byte.resize(256);
  auto& bucket = by_first_byte[static_cast<unsigned char>(content[0])];
  bucket.emplace_back(content, index);
  // Longest first, so the first hit at a position is the longest.
  std::stable_sort(bucket.begin(), bucket.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  empty = false;
}

StatusOr<std::unique_ptr<HuggingFaceTokenizer>> HuggingFaceTokenizer::load(const std::string& path) {
  if (path.empty())
    return InvalidArgument("--tokenizer-model is required for HuggingFaceTokenizer (a tokenizer.json or its folder)");
  std::string file = path, folder;
  if (is_dir(path)) {
    folder = path;
    file = path + "/tokenizer.json";
  } else {
    size_t slash = path.rfind('/');
    folder = slash == std::string::npos ? "." : path.substr(0, slash);
  }
  std::string text, config;
  if (!read_file(file, &text)) {
    if (is_dir(path)) return NotFound("--tokenizer-model ", path, ": the folder has no tokenizer.json");
    return NotFound("--tokenizer-model ", path,
                    ": cannot open file (Gale reads local tokenizer.json files; it does not download)");
  }
  read_file(folder + "/tokenizer_config.json", &config);
  return parse(text, config, "--tokenizer-model " + file);
}

StatusOr<std::unique_ptr<HuggingFaceTokenizer>> HuggingFaceTokenizer::parse(std::string_view tokenizer_json,
                                                                            std::string_view config_json,
                                                                            const std::string& name) {
  try {
    return parse_impl(tokenizer_json, config_json, name);
  } catch (const json::exception& e) {
    // A field of the wrong JSON type somewhere (e.g. a string where an id belongs).
    std::string what = e.what();
    size_t close = what.find("] ");
    return InvalidArgument(name, ": unexpected tokenizer.json content (",
                           close == std::string::npos ? what : what.substr(close + 2), ")");
  }
}

StatusOr<std::unique_ptr<HuggingFaceTokenizer>> HuggingFaceTokenizer::parse_impl(std::string_view tokenizer_json,
                                                                                 std::string_view config_json,
                                                                                 const std::string& name) {
  json j = json::parse(tokenizer_json, nullptr, false);
  if (j.is_discarded()) {
    if (tokenizer_json.size() > 0 &&
        (static_cast<unsigned char>(tokenizer_json[0]) == 0x0A || tokenizer_json[0] == '\x12'))
      return InvalidArgument(name,
                             ": expected a Hugging Face tokenizer.json, found binary data (a SentencePiece .model? "
                             "use --tokenizer-type SentencePieceTokenizer or Llama2Tokenizer)");
    return InvalidArgument(name, ": expected a Hugging Face tokenizer.json, found text that is not JSON");
  }
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object()) {
    if (j.is_object() && j.contains("<|endoftext|>"))
      return InvalidArgument(
          name,
          ": this is GPT-2's vocab.json, not a tokenizer.json; use --tokenizer-type GPT2BPETokenizer "
          "--vocab-file FILE --merge-file MERGES");
    return InvalidArgument(name,
                           ": expected a Hugging Face tokenizer.json (an object with a 'model'), found other JSON");
  }
  std::unique_ptr<HuggingFaceTokenizer> t(new HuggingFaceTokenizer());
  t->name_ = name;
  const json& model = j["model"];
  std::string model_type = model.value("type", "");
  if (model_type.empty() && model.contains("merges")) model_type = "BPE";
  if (model_type != "BPE")
    return Unimplemented(name, ": model type '", model_type, "' is not supported (Gale supports BPE models)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.contains(key) && model[key].is_string() && !model[key].get<std::string>().empty())
      return Unimplemented(name, ": BPE with ", key, " is not supported");
  if (model.contains("dropout") && model["dropout"].is_number() && model["dropout"].get<double>() > 0)
    return Unimplemented(name, ": BPE dropout is not supported");

  json config = config_json.empty() ? json::object() : json::parse(config_json, nullptr, false);
  if (config.is_discarded() || !config.is_object())
    return InvalidArgument(name, ": the tokenizer_config.json next to it is not a JSON object");
  // transformers' PreTrainedTokenizerFast (what Megatron loads) sets a top-level pre-tokenizer's
  // add_prefix_space to tokenizer_config.json's value, False when absent.
  json pre = j.value("pre_tokenizer", json());
  if (pre.is_object() && pre.contains("add_prefix_space")) {
    auto it = config.find("add_prefix_space");
    pre["add_prefix_space"] = it != config.end() && it->is_boolean() ? it->get<bool>() : false;
  }
  GALE_ASSIGN_OR_RETURN(t->normalizer_, HfNormalizer::parse(j.value("normalizer", json()), name));
  GALE_ASSIGN_OR_RETURN(t->pre_tokenizer_, HfPreTokenizer::parse(pre, name));
  GALE_ASSIGN_OR_RETURN(t->post_processor_, HfPostProcessor::parse(j.value("post_processor", json()), name));
  GALE_ASSIGN_OR_RETURN(t->decoder_, HfDecoder::parse(j.value("decoder", json()), name));
  bool byte_level = t->pre_tokenizer_.byte_level();

  // Vocabulary: ids as written; keys mapped to symbol space for the BPE model.
  if (!model.contains("vocab") || !model["vocab"].is_object())
    return InvalidArgument(name, ": model has no 'vocab' object");
  // Ids must be (nearly) dense: this bounds memory by the file size.
  const int64_t added_count =
      j.contains("added_tokens") && j["added_tokens"].is_array() ? static_cast<int64_t>(j["added_tokens"].size()) : 0;
  const int64_t max_id = 2 * (static_cast<int64_t>(model["vocab"].size()) + added_count) + 1024;
  StringIdMap symbols;
  std::set<std::string> all_contents;
  std::string bytes;
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
    if (!it.value().is_number_integer())
      return InvalidArgument(name, ": vocab entry '", it.key(), "' has no integer id");
    int64_t id = it.value().get<int64_t>();
    if (id < 0 || id >= max_id)
      return InvalidArgument(name, ": vocab id ", id, " is out of range for a vocabulary of ", model["vocab"].size(),
                             " tokens");
    if (static_cast<size_t>(id) >= t->id_to_token_.size()) t->id_to_token_.resize(static_cast<size_t>(id) + 1);
    t->id_to_token_[static_cast<size_t>(id)] = it.key();
    all_contents.insert(it.key());
    if (byte_level) {
      if (byte_level_decode(it.key(), &bytes)) symbols[bytes] = static_cast<int32_t>(id);
    } else {
      symbols[it.key()] = static_cast<int32_t>(id);
    }
  }
  std::vector<std::pair<std::string, std::string>> merges;
  if (model.contains("merges") && model["merges"].is_array()) {
    merges.reserve(model["merges"].size());
    std::string a, b;
    for (const auto& m : model["merges"]) {
      if (m.is_string()) {
        std::string s = m.get<std::string>();
        size_t sp = s.find(' ');
        if (sp == std::string::npos) return InvalidArgument(name, ": merge '", s, "' is not 'left right'");
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        a = m[0].get<std::string>();
        b = m[1].get<std::string>();
      } else {
        return InvalidArgument(name, ": merge ", m.dump(), " is neither 'left right' nor [left, right]");
      }
      if (byte_level) {
        std::string ra, rb;
        if (!byte_level_decode(a, &ra) || !byte_level_decode(b, &rb)) continue;  // can never apply to bytes
        merges.emplace_back(std::move(ra), std::move(rb));
      } else {
        merges.emplace_back(a, b);
      }
    }
  }
  BpeOptions options;
  options.byte_level = byte_level;
  options.byte_fallback = model.value("byte_fallback", false);
  options.fuse_unk = model.value("fuse_unk", false);
  options.ignore_merges = model.value("ignore_merges", false);
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    std::string unk = model["unk_token"].get<std::string>();
    auto it = model["vocab"].find(unk);
    if (it == model["vocab"].end()) return InvalidArgument(name, ": unk_token '", unk, "' is not in the vocabulary");
    options.unk_id = it->get<int32_t>();
  }
  GALE_ASSIGN_OR_RETURN(t->bpe_, BpeModel::create(symbols, merges, options, name));
  if (!byte_level) {
    const std::string kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's space
    bool safe = symbols.count(kSpace) > 0;
    for (auto it = symbols.begin(); safe && it != symbols.end(); ++it) {
      const std::string& tok = it->first;
      for (size_t p = tok.find(kSpace, 1); p != std::string::npos; p = tok.find(kSpace, p + 1)) {
        if (p < 3 || tok.compare(p - 3, 3, kSpace) != 0) {
          safe = false;
          break;
        }
      }
    }
    if (safe) t->space_split_ = kSpace;
  }

  // Added tokens.
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const auto& a : j["added_tokens"]) {
      if (!a.is_object() || !a.contains("id") || !a.contains("content"))
        return InvalidArgument(name, ": bad added token ", a.dump());
      AddedToken at{a["content"].get<std::string>(), a["id"].get<int32_t>(),   a.value("single_word", false),
                    a.value("lstrip", false),        a.value("rstrip", false), a.value("normalized", true),
                    a.value("special", false)};
      if (at.id < 0 || at.id >= max_id) return InvalidArgument(name, ": added token id ", at.id, " out of range");
      if (static_cast<size_t>(at.id) >= t->id_to_token_.size()) t->id_to_token_.resize(static_cast<size_t>(at.id) + 1);
      t->id_to_token_[static_cast<size_t>(at.id)] = at.content;
      all_contents.insert(at.content);
      t->added_.push_back(at);
    }
  }
  for (size_t i = 0; i < t->added_.size(); ++i) {
    const AddedToken& at = t->added_[i];
    if (at.normalized) {
      std::string c = at.content;
      GALE_RETURN_IF_ERROR(t->normalizer_.apply(&c));
      t->normalized_matcher_.add(c, static_cast<int>(i));
    } else {
      t->raw_matcher_.add(at.content, static_cast<int>(i));
    }
  }
  t->vocab_size_ = static_cast<int64_t>(all_contents.size());

  // EOD: tokenizer_config.json's eos_token, else a well-known end token.
  auto id_of = [&](const std::string& content) -> int32_t {
    for (const auto& at : t->added_)
      if (at.content == content) return at.id;
    auto it = model["vocab"].find(content);
    return it == model["vocab"].end() ? -1 : it->get<int32_t>();
  };
  std::string eos = config.contains("eos_token") ? token_content(config["eos_token"]) : "";
  if (!eos.empty()) {
    t->eod_ = id_of(eos);
    if (t->eod_ < 0) return InvalidArgument(name, ": tokenizer_config.json's eos_token '", eos, "' is not a token");
  } else {
    for (const char* guess : {"</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>"}) {
      if ((t->eod_ = id_of(guess)) >= 0) {
        eos = guess;
        break;
      }
    }
    if (t->eod_ < 0)
      return InvalidArgument(name,
                             ": cannot tell the end-of-document token; put a tokenizer_config.json with "
                             "\"eos_token\" next to tokenizer.json");
  }
  t->eod_token_ = eos;
  for (auto [key, out] : {std::pair<const char*, int32_t*>{"bos_token", &t->bos_id_}, {"pad_token", &t->pad_id_}}) {
    std::string content = config.contains(key) ? token_content(config[key]) : "";
    if (content.empty()) continue;
    *out = id_of(content);
    if (*out < 0) return InvalidArgument(name, ": tokenizer_config.json's ", key, " '", content, "' is not a token");
  }
  if (std::string unk = config.contains("unk_token") ? token_content(config["unk_token"]) : ""; !unk.empty())
    t->unk_id_ = id_of(unk);  // -1 when it is no token (transformers' unk_token_id is then None)
  if (std::string cls = config.contains("cls_token") ? token_content(config["cls_token"]) : ""; !cls.empty())
    t->cls_id_ = id_of(cls);
  // transformers' all_special_tokens (a name that is no token cannot occur among the ids).
  std::vector<std::string> specials;
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"})
    if (config.contains(key) && !config[key].is_null()) specials.push_back(token_content(config[key]));
  if (config.contains("additional_special_tokens") && config["additional_special_tokens"].is_array())
    for (const auto& s : config["additional_special_tokens"]) specials.push_back(token_content(s));
  for (const std::string& s : specials)
    if (int32_t id = s.empty() ? -1 : id_of(s); id >= 0) t->special_ids_.push_back(id);
  std::sort(t->special_ids_.begin(), t->special_ids_.end());
  return t;
}

bool HuggingFaceTokenizer::is_special_token(int32_t id) const {
  return std::binary_search(special_ids_.begin(), special_ids_.end(), id);
}

StatusOr<std::string> HuggingFaceTokenizer::decode_without_special_tokens(std::span<const int32_t> ids) const {
  std::vector<int32_t> kept;
  kept.reserve(ids.size());
  for (int32_t id : ids)
    if (!is_special_token(id)) kept.push_back(id);
  return decode(kept);
}

int32_t HuggingFaceTokenizer::token_id(std::string_view content) const {
  for (const auto& at : added_)
    if (at.content == content) return at.id;
  for (size_t i = 0; i < id_to_token_.size(); ++i)
    if (id_to_token_[i] == content) return static_cast<int32_t>(i);
  return -1;
}

void HuggingFaceTokenizer::split_added(std::string_view text, const Matcher& m, std::vector<Segment>* out) const {
  out->clear();
  if (m.empty) {
    out->push_back({0, text.size(), -1});
    return;
  }
  const unsigned char* p = reinterpret_cast<const unsigned char*>(text.data());
  size_t start = 0, i = 0;
  while (i < text.size()) {
    const auto& bucket = m.by_first_byte[p[i]];
    int hit = -1;
    for (const auto& [content, index] : bucket) {
      if (text.compare(i, content.size(), content) == 0) {
        hit = index;
        break;
      }
    }
    if (hit < 0 || (i > 0 && (p[i] & 0xC0) == 0x80)) {
      ++i;
      continue;
    }
    const AddedToken& at = added_[static_cast<size_t>(hit)];
    size_t b = i, e = i + at.content.size();
    if (at.single_word) {
      bool left_ok = true, right_ok = true;
      if (b > 0) {
        size_t k = b - 1;
        while (k > 0 && (p[k] & 0xC0) == 0x80) --k;
        int len;
        left_ok = !is_word_cp(decode_utf8(p + k, &len));
      }
      if (e < text.size()) {
        int len;
        right_ok = !is_word_cp(decode_utf8(p + e, &len));
      }
      if (!left_ok || !right_ok) {
        ++i;
        continue;
      }
    }
    if (at.lstrip) {
      size_t k = b;
      while (k > start) {
        size_t q = k - 1;
        while (q > start && (p[q] & 0xC0) == 0x80) --q;
        int len;
        if (!is_space_cp(decode_utf8(p + q, &len))) break;
        k = q;
      }
      b = k;
    }
    if (at.rstrip) {
      while (e < text.size()) {
        int len;
        if (!is_space_cp(decode_utf8(p + e, &len))) break;
        e += static_cast<size_t>(len);
      }
    }
    if (b > start) out->push_back({start, b, -1});
    out->push_back({b, e, at.id});
    start = i = e;
  }
  if (start < text.size()) out->push_back({start, text.size(), -1});
}

Status HuggingFaceTokenizer::encode_normalized(std::string_view text, bool at_start, std::vector<int32_t>* ids) const {
  thread_local Pieces words;
  pre_tokenizer_.apply(text, at_start, &words);
  uint32_t start = 0;
  const std::string& sp = space_split_;
  for (uint32_t end : words.ends) {
    std::string_view word = std::string_view(words.text).substr(start, end - start);
    start = end;
    if (sp.empty() || word.size() <= 64) {
      bpe_->encode_word(word, ids);
      continue;
    }
    // Split before every U+2581 that follows another character (see space_split_).
    size_t piece = 0;
    for (size_t p = word.find(sp, 1); p != std::string_view::npos; p = word.find(sp, p + sp.size())) {
      if (word.compare(p - sp.size(), sp.size(), sp) == 0) continue;
      bpe_->encode_word(word.substr(piece, p - piece), ids);
      piece = p;
    }
    bpe_->encode_word(word.substr(piece), ids);
  }
  return Status::Ok();
}

Status HuggingFaceTokenizer::encode_segment(std::string_view text, bool at_start, std::vector<int32_t>* ids) const {
  std::string normalized(text);
  GALE_RETURN_IF_ERROR(normalizer_.apply(&normalized));
  if (normalized_matcher_.empty) return encode_normalized(normalized, at_start, ids);
  std::vector<Segment> parts;
  split_added(normalized, normalized_matcher_, &parts);
  for (const Segment& s : parts) {
    if (s.id >= 0) {
      ids->push_back(s.id);
    } else {
      GALE_RETURN_IF_ERROR(encode_normalized(std::string_view(normalized).substr(s.begin, s.end - s.begin),
                                             at_start && s.begin == 0, ids));
    }
  }
  return Status::Ok();
}

Status HuggingFaceTokenizer::encode_plain(std::string_view text, std::vector<int32_t>* ids) const {
  GALE_RETURN_IF_ERROR(check_utf8(text));
  std::vector<Segment> parts;
  split_added(text, raw_matcher_, &parts);
  for (const Segment& s : parts) {
    if (s.id >= 0) {
      ids->push_back(s.id);
    } else {
      GALE_RETURN_IF_ERROR(encode_segment(text.substr(s.begin, s.end - s.begin), s.begin == 0, ids));
    }
  }
  return Status::Ok();
}

Status HuggingFaceTokenizer::encode(std::string_view text, std::vector<int32_t>* ids) const {
  ids->insert(ids->end(), post_processor_.prefix().begin(), post_processor_.prefix().end());
  GALE_RETURN_IF_ERROR(encode_plain(text, ids));
  ids->insert(ids->end(), post_processor_.suffix().begin(), post_processor_.suffix().end());
  return Status::Ok();
}

StatusOr<std::string> HuggingFaceTokenizer::decode(std::span<const int32_t> ids) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || id_to_token_[static_cast<size_t>(id)].empty())
      return OutOfRange(name_, ": id ", id, " is not in the vocabulary");
    tokens.push_back(id_to_token_[static_cast<size_t>(id)]);
  }
  return decoder_.decode(std::move(tokens));
}

std::string HuggingFaceTokenizer::describe() const {
  return str_cat("HuggingFaceTokenizer (", name_, "): vocabulary ", vocab_size_, ", eod ", eod_, " (", eod_token_, ")",
                 pre_tokenizer_.byte_level() ? ", byte-level BPE" : ", BPE");
}

}  // namespace gale
