// Megatron's HuggingFaceTokenizer for a local tokenizer.json (a file, or a folder holding
// tokenizer.json and optionally tokenizer_config.json): BPE with byte-level or Metaspace
// pre-tokenisation, byte fallback, normalizers, added and special tokens, and the
// post-processor's special tokens (Megatron calls the tokenizer with add_special_tokens=True).
//
// Megatron's values: vocab_size = len(tokenizer) (vocabulary plus added tokens); eod =
// eos_token_id, taken from tokenizer_config.json's eos_token, or else the first of </s>,
// <|endoftext|>, <|end_of_text|>, <eos> that the tokenizer has.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer/bpe.h"
#include "tokenizer/hf_components.h"
#include "tokenizer/tokenizer.h"

namespace gale {

class HuggingFaceTokenizer : public Tokenizer {
 public:
  // `path` is a tokenizer.json or a folder containing one.
  static StatusOr<std::unique_ptr<HuggingFaceTokenizer>> load(const std::string& path);
  // From file contents; `config_json` may be empty (no tokenizer_config.json).
  static StatusOr<std::unique_ptr<HuggingFaceTokenizer>> parse(std::string_view tokenizer_json,
                                                               std::string_view config_json, const std::string& name);

  const std::string& type() const override { return type_; }
  int64_t vocab_size() const override { return vocab_size_; }
  int32_t eod() const override { return eod_; }
  // bos_token, else cls_token (Megatron's HuggingFaceTokenizer copies a missing bos from cls).
  int32_t bos() const override { return bos_id_ >= 0 ? bos_id_ : cls_id_; }
  Status encode(std::string_view text, std::vector<int32_t>* ids) const override;
  StatusOr<std::string> decode(std::span<const int32_t> ids) const override;
  std::string describe() const override;

  // Encode without the post-processor's special tokens (add_special_tokens=False).
  Status encode_plain(std::string_view text, std::vector<int32_t>* ids) const;
  const std::string& eod_token() const { return eod_token_; }
  // The id of the token spelled `content` (an added token, or a tokenizer.json vocabulary entry
  // in its tokenizer.json spelling), or -1 when there is none.
  int32_t token_id(std::string_view content) const;
  // tokenizer_config.json's bos_token, pad_token and unk_token ids, -1 when the file does not name them.
  int32_t bos_token_id() const { return bos_id_; }
  int32_t pad_token_id() const { return pad_id_; }
  int32_t unk_token_id() const { return unk_id_; }
  // Whether `id` is one of transformers' all_special_tokens: tokenizer_config.json's bos, eos, unk,
  // sep, pad, cls and mask tokens and its additional_special_tokens.
  bool is_special_token(int32_t id) const;
  // Megatron's HuggingFaceTokenizer.ids_to_text(ids, remove_special_tokens=True): the decoder over
  // the tokens of `ids` that are not special tokens (is_special_token).
  StatusOr<std::string> decode_without_special_tokens(std::span<const int32_t> ids) const;

 private:
  HuggingFaceTokenizer() = default;
  static StatusOr<std::unique_ptr<HuggingFaceTokenizer>> parse_impl(std::string_view tokenizer_json,
                                                                    std::string_view config_json,
                                                                    const std::string& name);
  struct AddedToken {
    std::string content;
    int32_t id;
    bool single_word, lstrip, rstrip, normalized, special;
  };
  // Leftmost-longest matching of added-token contents.
  struct Matcher {
    std::vector<std::vector<std::pair<std::string, int>>> by_first_byte;  // content, index into tokens_
    bool empty = true;
    void add(const std::string& content, int index);
  };
  struct Segment {
    size_t begin, end;
    int32_t id;  // -1: text to tokenize
  };
  void split_added(std::string_view text, const Matcher& m, std::vector<Segment>* out) const;
  Status encode_segment(std::string_view text, bool at_start, std::vector<int32_t>* ids) const;
  Status encode_normalized(std::string_view text, bool at_start, std::vector<int32_t>* ids) const;

  std::string type_ = "HuggingFaceTokenizer";
  std::string name_;
  HfNormalizer normalizer_;
  HfPreTokenizer pre_tokenizer_;
  HfPostProcessor post_processor_;
  HfDecoder decoder_;
  std::unique_ptr<BpeModel> bpe_;
  std::vector<std::string> id_to_token_;  // the tokenizer.json spelling of every id
  std::vector<AddedToken> added_;
  Matcher raw_matcher_, normalized_matcher_;
  // "\u2581" when no vocabulary token has a character other than U+2581 followed by U+2581 (true
  // of SentencePiece-trained vocabularies such as LLaMA's and Mistral's): then no merge can cross
  // such a boundary and long words are encoded piece by piece (with the word cache), exactly.
  std::string space_split_;
  int64_t vocab_size_ = 0;
  int32_t eod_ = -1;
  int32_t bos_id_ = -1, pad_id_ = -1, unk_id_ = -1, cls_id_ = -1;
  std::vector<int32_t> special_ids_;  // sorted
  std::string eod_token_;
};

}  // namespace gale
