// Megatron's TikTokenizer (CustomTikTokenizer): a JSON list of base64 byte tokens in rank order,
// the v1 or v2 split pattern, rank-based byte-level BPE, and a block of special tokens first.
//
// The ids are Megatron's: the special tokens take ids 0..N-1 (N = --tiktoken-num-special-tokens,
// default 1000): the --tiktoken-special-tokens list in its order (default <unk> <s> </s>; it must
// hold those three), then fillers <SPECIAL_k> up to N; the file's token of rank r has id N + r,
// and only the first --vocab-size − N ranks are read (--vocab-size defaults to 2^17). eod is </s>.
// Special tokens in the text are ordinary text (Megatron tokenizes with encode_ordinary); decoding
// joins the tokens' bytes (a special token's bytes are its text) and replaces invalid UTF-8 with
// U+FFFD, as tiktoken's decode does.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tokenizer/bpe.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"

namespace gale {

struct TiktokenOptions {
  std::string pattern;                      // --tiktoken-pattern: v1 or v2
  int64_t vocab_size = -1;                  // --vocab-size; -1: 131072
  int64_t num_special_tokens = 1000;        // --tiktoken-num-special-tokens
  std::vector<std::string> special_tokens;  // --tiktoken-special-tokens; empty: <unk> <s> </s>
};

class TikTokenizer : public Tokenizer {
 public:
  static StatusOr<std::unique_ptr<TikTokenizer>> load(const std::string& path, const TiktokenOptions& options);
  // From the file's contents (`name` is used in errors).
  static StatusOr<std::unique_ptr<TikTokenizer>> parse(std::string_view json_text, const std::string& name,
                                                       const TiktokenOptions& options);

  const std::string& type() const override { return type_; }
  int64_t vocab_size() const override { return static_cast<int64_t>(id_to_bytes_.size()); }
  int32_t eod() const override { return eos_; }
  int32_t bos() const override { return bos_; }
  int32_t unk() const { return unk_; }
  Status encode(std::string_view text, std::vector<int32_t>* ids) const override;
  StatusOr<std::string> decode(std::span<const int32_t> ids) const override;
  std::string describe() const override;

 private:
  TikTokenizer() = default;
  std::string type_ = "TikTokenizer";
  std::string file_;
  SplitPattern pattern_ = SplitPattern::kTiktokenV1;
  std::string pattern_name_;
  int64_t num_special_ = 0;
  std::unique_ptr<BpeModel> bpe_;
  std::vector<std::string> id_to_bytes_;  // raw bytes of each id (special tokens: their text)
  int32_t unk_ = -1, bos_ = -1, eos_ = -1;
};

// RFC 4648 base64 with padding (Megatron's files are written by Python's base64.b64encode); false
// on any other character or a bad length.
bool base64_decode(std::string_view text, std::string* out);

}  // namespace gale
