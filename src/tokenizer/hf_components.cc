// tokenizer.json normalizers, pre-tokenizers, post-processors and decoders.
#include "tokenizer/hf_components.h"

#include <algorithm>
#include <cstdint>

#include "tokenizer/byte_level.h"
#include "tokenizer/unicode.h"
#include "tokenizer/unicode_normalize.h"

namespace gale {

namespace {
using json = nlohmann::json;

std::string type_of(const json& j) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) return "";
  return j["type"].get<std::string>();
}

bool get_bool(const json& j, const char* key, bool fallback) {
  auto it = j.find(key);
  return it != j.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

StatusOr<std::string> get_string(const json& j, const char* key, const std::string& what) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return InvalidArgument(what, ": expected a string field '", key, "'");
  return it->get<std::string>();
}

void replace_all(std::string* s, const std::string& from, const std::string& to) {
  if (from.empty() || s->find(from) == std::string::npos) return;
  std::string out;
  out.reserve(s->size());
  size_t pos = 0;
  while (true) {
    size_t hit = s->find(from, pos);
    if (hit == std::string::npos) break;
    out.append(*s, pos, hit - pos);
    out += to;
    pos = hit + from.size();
  }
  out.append(*s, pos, std::string::npos);
  s->swap(out);
}

bool is_white_space(uint32_t cp) { return char_class(cp) == CharClass::kSpace; }

// A token id a post-processor adds: a non-negative integer that fits int32.
StatusOr<int32_t> post_processor_id(const json& v, const std::string& what) {
  if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
    return InvalidArgument(what, ": expected a non-negative token id, found ", v.dump());
  return static_cast<int32_t>(v.get<int64_t>());
}

StatusOr<std::string> string_pattern(const json& j, const std::string& what) {
  auto it = j.find("pattern");
  if (it == j.end() || !it->is_object()) return InvalidArgument(what, ": expected a 'pattern' object");
  if (it->contains("String") && (*it)["String"].is_string()) return (*it)["String"].get<std::string>();
  if (it->contains("Regex"))
    return Unimplemented(what, " with a regex pattern ", (*it)["Regex"].dump(), " is not supported");
  return InvalidArgument(what, ": expected pattern {\"String\": ...}");
}

int prepend_scheme(const json& j) {
  if (j.contains("prepend_scheme") && j["prepend_scheme"].is_string()) {
    std::string s = j["prepend_scheme"].get<std::string>();
    return s == "first" ? 1 : s == "never" ? 2 : 0;
  }
  return get_bool(j, "add_prefix_space", true) ? 0 : 2;  // older files
}
}  // namespace

// ---------------------------------------------------------------------------------------------
// Normalizer

StatusOr<HfNormalizer> HfNormalizer::parse(const json& j, const std::string& name) {
  HfNormalizer n;
  GALE_RETURN_IF_ERROR(n.add(j, name));
  return n;
}

Status HfNormalizer::add(const json& j, const std::string& name) {
  if (j.is_null()) return Status::Ok();
  std::string t = type_of(j);
  std::string what = name + ": normalizer " + t;
  if (t == "Sequence") {
    if (!j.contains("normalizers") || !j["normalizers"].is_array())
      return InvalidArgument(what, ": expected 'normalizers'");
    for (const auto& n : j["normalizers"]) GALE_RETURN_IF_ERROR(add(n, name));
  } else if (t == "Prepend") {
    GALE_ASSIGN_OR_RETURN(std::string p, get_string(j, "prepend", what));
    steps_.push_back({Kind::kPrepend, p, ""});
  } else if (t == "Replace") {
    GALE_ASSIGN_OR_RETURN(std::string from, string_pattern(j, what));
    GALE_ASSIGN_OR_RETURN(std::string to, get_string(j, "content", what));
    steps_.push_back({Kind::kReplace, from, to});
  } else if (t == "NFC") {
    steps_.push_back({Kind::kNfc, "", ""});
  } else if (t == "NFD") {
    steps_.push_back({Kind::kNfd, "", ""});
  } else if (t == "NFKC") {
    steps_.push_back({Kind::kNfkc, "", ""});
  } else if (t == "NFKD") {
    steps_.push_back({Kind::kNfkd, "", ""});
  } else if (t == "Lowercase") {
    steps_.push_back({Kind::kLowercase, "", ""});
  } else if (t == "Strip") {
    Step s{Kind::kStrip, "", ""};
    s.left = get_bool(j, "strip_left", false);
    s.right = get_bool(j, "strip_right", false);
    steps_.push_back(s);
  } else {
    return Unimplemented(
        name, ": normalizer type '", t,
        "' is not supported (Gale supports Sequence, Prepend, Replace, NFC, NFD, NFKC, NFKD, Lowercase, Strip)");
  }
  return Status::Ok();
}

Status HfNormalizer::apply(std::string* text) const {
  for (const Step& s : steps_) {
    switch (s.kind) {
      case Kind::kPrepend:
        if (!text->empty()) text->insert(0, s.a);
        break;
      case Kind::kReplace:
        replace_all(text, s.a, s.b);
        break;
      case Kind::kNfc:
        GALE_RETURN_IF_ERROR(unicode_normalize(NormalForm::kNfc, text));
        break;
      case Kind::kNfd:
        GALE_RETURN_IF_ERROR(unicode_normalize(NormalForm::kNfd, text));
        break;
      case Kind::kNfkc:
        GALE_RETURN_IF_ERROR(unicode_normalize(NormalForm::kNfkc, text));
        break;
      case Kind::kNfkd:
        GALE_RETURN_IF_ERROR(unicode_normalize(NormalForm::kNfkd, text));
        break;
      case Kind::kLowercase:
        GALE_RETURN_IF_ERROR(unicode_lowercase(text));
        break;
      case Kind::kStrip: {
        const unsigned char* p = reinterpret_cast<const unsigned char*>(text->data());
        size_t b = 0, e = text->size();
        int len;
        if (s.left)
          while (b < e && is_white_space(decode_utf8(p + b, &len))) b += static_cast<size_t>(len);
        if (s.right)
          while (e > b) {
            size_t k = e - 1;
            while (k > b && (p[k] & 0xC0) == 0x80) --k;
            if (!is_white_space(decode_utf8(p + k, &len))) break;
            e = k;
          }
        *text = text->substr(b, e - b);
        break;
      }
    }
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// Pre-tokenizer

StatusOr<HfPreTokenizer> HfPreTokenizer::parse(const json& j, const std::string& name) {
  HfPreTokenizer p;
  GALE_RETURN_IF_ERROR(p.add(j, name));
  return p;
}

Status HfPreTokenizer::add(const json& j, const std::string& name) {
  if (j.is_null()) return Status::Ok();
  std::string t = type_of(j);
  std::string what = name + ": pre_tokenizer " + t;
  if (t == "Sequence") {
    if (!j.contains("pretokenizers") || !j["pretokenizers"].is_array())
      return InvalidArgument(what, ": expected 'pretokenizers'");
    for (const auto& p : j["pretokenizers"]) GALE_RETURN_IF_ERROR(add(p, name));
  } else if (t == "ByteLevel") {
    Step s;
    s.kind = Kind::kByteLevel;
    s.add_prefix_space = get_bool(j, "add_prefix_space", true);
    s.use_regex = get_bool(j, "use_regex", true);
    s.pattern = SplitPattern::kGpt2;
    steps_.push_back(s);
    byte_level_ = true;
  } else if (t == "Split") {
    std::string behavior = j.value("behavior", "");
    if (behavior != "Isolated")
      return Unimplemented(what, ": behavior '", behavior, "' is not supported (only Isolated)");
    if (get_bool(j, "invert", false)) return Unimplemented(what, ": invert is not supported");
    auto pat = j.find("pattern");
    if (pat == j.end() || !pat->is_object() || !pat->contains("Regex") || !(*pat)["Regex"].is_string())
      return Unimplemented(what, ": only regex patterns are supported");
    std::string regex = (*pat)["Regex"].get<std::string>();
    auto known = recognize_split_pattern(regex);
    if (!known)
      return Unimplemented(what, ": pattern ", json(regex).dump(),
                           " is not supported (Gale knows the GPT-2, Llama-3/cl100k and Qwen2 patterns)");
    Step s;
    s.kind = Kind::kSplit;
    s.pattern = *known;
    steps_.push_back(s);
  } else if (t == "Metaspace") {
    Step s;
    s.kind = Kind::kMetaspace;
    GALE_ASSIGN_OR_RETURN(s.replacement, get_string(j, "replacement", what));
    if (s.replacement.empty()) return InvalidArgument(what, ": empty replacement");
    s.prepend = prepend_scheme(j);
    s.split = get_bool(j, "split", true);
    steps_.push_back(s);
  } else if (t == "Digits") {
    Step s;
    s.kind = Kind::kDigits;
    s.individual_digits = get_bool(j, "individual_digits", false);
    steps_.push_back(s);
  } else {
    return Unimplemented(name, ": pre_tokenizer type '", t,
                         "' is not supported (Gale supports Sequence, ByteLevel, Split, Metaspace, Digits)");
  }
  return Status::Ok();
}

void HfPreTokenizer::apply(std::string_view piece, bool at_start, Pieces* out) const {
  out->text.assign(piece);
  out->ends.clear();
  if (!piece.empty()) out->ends.push_back(static_cast<uint32_t>(piece.size()));
  Pieces next;
  for (const Step& s : steps_) {
    next.text.clear();
    next.ends.clear();
    uint32_t start = 0;
    bool first = true;
    for (uint32_t end : out->ends) {
      std::string_view p(out->text.data() + start, end - start);
      start = end;
      bool piece_at_start = first && at_start;
      first = false;
      uint32_t base = static_cast<uint32_t>(next.text.size());
      switch (s.kind) {
        case Kind::kByteLevel: {
          if (s.add_prefix_space && (p.empty() || p[0] != ' ')) next.text.push_back(' ');
          next.text.append(p);
          std::string_view q(next.text.data() + base, next.text.size() - base);
          if (s.use_regex) {
            size_t before = next.ends.size();
            pretokenize(SplitPattern::kGpt2, q, &next.ends);
            for (size_t k = before; k < next.ends.size(); ++k) next.ends[k] += base;
          } else if (!q.empty()) {
            next.ends.push_back(static_cast<uint32_t>(next.text.size()));
          }
          break;
        }
        case Kind::kSplit: {
          next.text.append(p);
          size_t before = next.ends.size();
          pretokenize(s.pattern, p, &next.ends);
          for (size_t k = before; k < next.ends.size(); ++k) next.ends[k] += base;
          break;
        }
        case Kind::kMetaspace: {
          std::string m(p);
          replace_all(&m, " ", s.replacement);
          bool starts = m.compare(0, s.replacement.size(), s.replacement) == 0;
          if (!starts && (s.prepend == 0 || (s.prepend == 1 && piece_at_start))) m.insert(0, s.replacement);
          next.text += m;
          if (!s.split) {
            if (!m.empty()) next.ends.push_back(static_cast<uint32_t>(next.text.size()));
            break;
          }
          // MergedWithNext: every replacement character starts a new word.
          size_t pos = 0;
          for (size_t h = m.find(s.replacement); h != std::string::npos;
               h = m.find(s.replacement, h + s.replacement.size())) {
            if (h > pos) {
              next.ends.push_back(base + static_cast<uint32_t>(h));
              pos = h;
            }
          }
          if (pos < m.size()) next.ends.push_back(base + static_cast<uint32_t>(m.size()));
          break;
        }
        case Kind::kDigits: {
          next.text.append(p);
          const unsigned char* q = reinterpret_cast<const unsigned char*>(p.data());
          size_t i = 0;
          while (i < p.size()) {
            int len;
            bool digit = char_class(decode_utf8(q + i, &len)) == CharClass::kNumber;
            size_t j = i + static_cast<size_t>(len);
            if (!digit || !s.individual_digits) {
              while (j < p.size()) {
                int l2;
                bool d2 = char_class(decode_utf8(q + j, &l2)) == CharClass::kNumber;
                if (d2 != digit) break;
                j += static_cast<size_t>(l2);
              }
            }
            next.ends.push_back(base + static_cast<uint32_t>(j));
            i = j;
          }
          break;
        }
      }
    }
    std::swap(*out, next);
  }
}

// ---------------------------------------------------------------------------------------------
// Post-processor

StatusOr<HfPostProcessor> HfPostProcessor::parse(const json& j, const std::string& name) {
  HfPostProcessor p;
  GALE_RETURN_IF_ERROR(p.add(j, name));
  return p;
}

Status HfPostProcessor::add(const json& j, const std::string& name) {
  if (j.is_null()) return Status::Ok();
  std::string t = type_of(j);
  std::string what = name + ": post_processor " + t;
  if (t == "Sequence") {
    if (!j.contains("processors") || !j["processors"].is_array())
      return InvalidArgument(what, ": expected 'processors'");
    for (const auto& p : j["processors"]) GALE_RETURN_IF_ERROR(add(p, name));
  } else if (t == "ByteLevel") {
    // Offsets only.
  } else if (t == "TemplateProcessing") {
    if (!j.contains("single") || !j["single"].is_array()) return InvalidArgument(what, ": expected 'single'");
    const json& specials = j.contains("special_tokens") ? j["special_tokens"] : json::object();
    bool seen_sequence = false;
    std::vector<int32_t> prefix, suffix;
    for (const auto& item : j["single"]) {
      if (item.contains("Sequence")) {
        seen_sequence = true;
        continue;
      }
      if (!item.contains("SpecialToken") || !item["SpecialToken"].contains("id"))
        return InvalidArgument(what, ": unexpected template item ", item.dump());
      std::string id = item["SpecialToken"]["id"].get<std::string>();
      if (!specials.contains(id) || !specials[id].contains("ids") || !specials[id]["ids"].is_array())
        return InvalidArgument(what, ": special token '", id, "' has no ids");
      for (const auto& v : specials[id]["ids"]) {
        GALE_ASSIGN_OR_RETURN(int32_t token, post_processor_id(v, what + " special token '" + id + "'"));
        (seen_sequence ? suffix : prefix).push_back(token);
      }
    }
    prefix_.insert(prefix_.end(), prefix.begin(), prefix.end());
    suffix_.insert(suffix_.begin(), suffix.begin(), suffix.end());
  } else if (t == "RobertaProcessing" || t == "BertProcessing") {
    if (!j.contains("cls") || !j.contains("sep") || !j["cls"].is_array() || j["cls"].size() != 2 ||
        !j["sep"].is_array() || j["sep"].size() != 2)
      return InvalidArgument(what, ": expected 'cls' and 'sep' as [token, id]");
    GALE_ASSIGN_OR_RETURN(int32_t cls, post_processor_id(j["cls"][1], what + " cls"));
    GALE_ASSIGN_OR_RETURN(int32_t sep, post_processor_id(j["sep"][1], what + " sep"));
    prefix_.push_back(cls);
    suffix_.push_back(sep);
  } else {
    return Unimplemented(name, ": post_processor type '", t,
                         "' is not supported (Gale supports TemplateProcessing, ByteLevel, RobertaProcessing, "
                         "BertProcessing, Sequence)");
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// Decoder

StatusOr<HfDecoder> HfDecoder::parse(const json& j, const std::string& name) {
  HfDecoder d;
  GALE_RETURN_IF_ERROR(d.add(j, name));
  return d;
}

Status HfDecoder::add(const json& j, const std::string& name) {
  if (j.is_null()) return Status::Ok();
  std::string t = type_of(j);
  std::string what = name + ": decoder " + t;
  if (t == "Sequence") {
    if (!j.contains("decoders") || !j["decoders"].is_array()) return InvalidArgument(what, ": expected 'decoders'");
    for (const auto& d : j["decoders"]) GALE_RETURN_IF_ERROR(add(d, name));
  } else if (t == "ByteLevel") {
    steps_.push_back(Step{Kind::kByteLevel, {}, {}});
  } else if (t == "Metaspace") {
    Step s;
    s.kind = Kind::kMetaspace;
    GALE_ASSIGN_OR_RETURN(s.a, get_string(j, "replacement", what));
    if (s.a.empty()) return InvalidArgument(what, ": empty replacement");
    s.prepend = prepend_scheme(j) != 2;
    steps_.push_back(s);
  } else if (t == "Replace") {
    Step s;
    s.kind = Kind::kReplace;
    GALE_ASSIGN_OR_RETURN(s.a, string_pattern(j, what));
    GALE_ASSIGN_OR_RETURN(s.b, get_string(j, "content", what));
    steps_.push_back(s);
  } else if (t == "ByteFallback") {
    steps_.push_back(Step{Kind::kByteFallback, {}, {}});
  } else if (t == "Fuse") {
    steps_.push_back(Step{Kind::kFuse, {}, {}});
  } else if (t == "Strip") {
    Step s;
    s.kind = Kind::kStrip;
    GALE_ASSIGN_OR_RETURN(s.a, get_string(j, "content", what));
    if (s.a.empty()) return InvalidArgument(what, ": empty content");
    s.start = std::clamp(j.value("start", 0), 0, 1 << 16);
    s.stop = std::clamp(j.value("stop", 0), 0, 1 << 16);
    steps_.push_back(s);
  } else {
    return Unimplemented(
        name, ": decoder type '", t,
        "' is not supported (Gale supports Sequence, ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip)");
  }
  return Status::Ok();
}

std::string HfDecoder::decode(std::vector<std::string> tokens) const {
  if (steps_.empty()) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  std::vector<std::string> next;
  for (const Step& s : steps_) {
    switch (s.kind) {
      case Kind::kByteLevel: {
        std::string bytes, b;
        for (const auto& t : tokens) bytes += byte_level_decode(t, &b) ? b : t;
        tokens.assign(1, utf8_lossy(bytes));
        break;
      }
      case Kind::kMetaspace:
        for (size_t i = 0; i < tokens.size(); ++i) {
          std::string& t = tokens[i];
          if (i == 0 && s.prepend) {
            replace_all(&t, s.a, "");
          } else {
            replace_all(&t, s.a, " ");
          }
        }
        break;
      case Kind::kReplace:
        for (auto& t : tokens) replace_all(&t, s.a, s.b);
        break;
      case Kind::kByteFallback: {
        next.clear();
        std::string bytes;
        auto flush = [&] {
          if (bytes.empty()) return;
          if (find_invalid_utf8(bytes) == std::string::npos) {
            next.push_back(bytes);
          } else {
            for (size_t k = 0; k < bytes.size(); ++k) next.push_back("\xEF\xBF\xBD");
          }
          bytes.clear();
        };
        for (auto& t : tokens) {
          auto hex = [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); };
          if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' && hex(t[3]) && hex(t[4])) {
            bytes.push_back(static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16)));
          } else {
            flush();
            next.push_back(std::move(t));
          }
        }
        flush();
        tokens.swap(next);
        break;
      }
      case Kind::kFuse: {
        std::string all;
        for (const auto& t : tokens) all += t;
        tokens.assign(1, all);
        break;
      }
      case Kind::kStrip:
        for (auto& t : tokens) {
          // Count in characters: the content is one character.
          size_t b = 0, e = t.size();
          for (int k = 0; k < s.start && t.compare(b, s.a.size(), s.a) == 0 && b < e; ++k) b += s.a.size();
          for (int k = 0; k < s.stop && e >= b + s.a.size() && t.compare(e - s.a.size(), s.a.size(), s.a) == 0; ++k)
            e -= s.a.size();
          t = t.substr(b, e - b);
        }
        break;
    }
  }
  std::string out;
  for (const auto& t : tokens) out += t;
  return out;
}

}  // namespace gale
