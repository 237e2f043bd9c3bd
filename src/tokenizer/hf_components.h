// The pipeline stages of a Hugging Face tokenizer.json that Gale implements: normalizers,
// pre-tokenizers, post-processors and decoders, parsed from their JSON and applied with the
// `tokenizers` library's semantics. An unsupported stage is a load-time error that names it.
//
//   normalizer:     Sequence, Prepend, Replace (string pattern), NFC, NFD, NFKC, NFKD, Lowercase, Strip
//   pre_tokenizer:  Sequence, ByteLevel, Split (GPT-2 / Llama-3 / Qwen2 patterns, Isolated),
//                   Metaspace, Digits
//   post_processor: TemplateProcessing, ByteLevel, RobertaProcessing, BertProcessing, Sequence
//   decoder:        Sequence, ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "tokenizer/pretokenizer.h"

namespace gale {

class HfNormalizer {
 public:
  static StatusOr<HfNormalizer> parse(const nlohmann::json& j, const std::string& name);
  bool empty() const { return steps_.empty(); }
  Status apply(std::string* text) const;

 private:
  enum class Kind { kPrepend, kReplace, kNfc, kNfd, kNfkc, kNfkd, kLowercase, kStrip };
  struct Step {
    Kind kind;
    std::string a, b;  // Prepend: a; Replace: a -> b
    bool left = false, right = false;
  };
  Status add(const nlohmann::json& j, const std::string& name);
  std::vector<Step> steps_;
};

// Words of a normalized piece: `text` with piece k = [ends[k-1], ends[k]).
struct Pieces {
  std::string text;
  std::vector<uint32_t> ends;
};

class HfPreTokenizer {
 public:
  static StatusOr<HfPreTokenizer> parse(const nlohmann::json& j, const std::string& name);
  bool byte_level() const { return byte_level_; }
  // Splits `piece` into words. `at_start`: the piece begins at offset 0 of the original text
  // (Metaspace's prepend_scheme "first").
  void apply(std::string_view piece, bool at_start, Pieces* out) const;

 private:
  enum class Kind { kByteLevel, kSplit, kMetaspace, kDigits };
  struct Step {
    Kind kind = Kind::kByteLevel;
    bool add_prefix_space = false, use_regex = true;  // ByteLevel
    SplitPattern pattern = SplitPattern::kGpt2;       // Split, ByteLevel regex
    std::string replacement;                          // Metaspace
    int prepend = 0;                                  // Metaspace: 0 always, 1 first, 2 never
    bool split = true;                                // Metaspace
    bool individual_digits = false;                   // Digits
  };
  Status add(const nlohmann::json& j, const std::string& name);
  std::vector<Step> steps_;
  bool byte_level_ = false;
};

class HfPostProcessor {
 public:
  // `token_id` resolves a token's content to its id (for Roberta/Bert processors).
  static StatusOr<HfPostProcessor> parse(const nlohmann::json& j, const std::string& name);
  const std::vector<int32_t>& prefix() const { return prefix_; }
  const std::vector<int32_t>& suffix() const { return suffix_; }

 private:
  Status add(const nlohmann::json& j, const std::string& name);
  std::vector<int32_t> prefix_, suffix_;
};

class HfDecoder {
 public:
  static StatusOr<HfDecoder> parse(const nlohmann::json& j, const std::string& name);
  // `tokens` are the token strings as in the tokenizer.json vocabulary / added tokens.
  std::string decode(std::vector<std::string> tokens) const;

 private:
  enum class Kind { kByteLevel, kMetaspace, kReplace, kByteFallback, kFuse, kStrip };
  struct Step {
    Kind kind = Kind::kByteLevel;
    std::string a, b;  // Replace a -> b; Metaspace replacement in a; Strip content in a
    int start = 0, stop = 0;
    bool prepend = true;  // Metaspace: strip the first token's replacement characters
  };
  Status add(const nlohmann::json& j, const std::string& name);
  std::vector<Step> steps_;
};

}  // namespace gale
