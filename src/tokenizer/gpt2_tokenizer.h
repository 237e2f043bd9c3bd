// Megatron's GPT2BPETokenizer: OpenAI's vocab.json + merges.txt, GPT-2's split pattern,
// byte-level BPE. Special tokens in the text are ordinary text (Megatron passes none).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tokenizer/bpe.h"
#include "tokenizer/tokenizer.h"

namespace gale {

class Gpt2BpeTokenizer : public Tokenizer {
 public:
  static StatusOr<std::unique_ptr<Gpt2BpeTokenizer>> load(const std::string& vocab_file, const std::string& merge_file);
  // From file contents (names are used in errors).
  static StatusOr<std::unique_ptr<Gpt2BpeTokenizer>> parse(std::string_view vocab_json, std::string_view merges_txt,
                                                           const std::string& vocab_name,
                                                           const std::string& merges_name);

  const std::string& type() const override { return type_; }
  int64_t vocab_size() const override { return static_cast<int64_t>(id_to_token_.size()); }
  int32_t eod() const override { return eod_; }
  int32_t bos() const override { return eod_; }  // <|endoftext|>, GPT-2's bos_token as well as its eos_token
  Status encode(std::string_view text, std::vector<int32_t>* ids) const override;
  StatusOr<std::string> decode(std::span<const int32_t> ids) const override;
  std::string describe() const override;

 private:
  Gpt2BpeTokenizer() = default;
  std::string type_ = "GPT2BPETokenizer";
  std::string files_;
  std::unique_ptr<BpeModel> bpe_;
  std::vector<std::string> id_to_token_;  // raw bytes of each id
  int32_t eod_ = -1;
};

// Reads merges.txt: the first line (#version) is skipped, then one "left right" pair per line.
StatusOr<std::vector<std::pair<std::string, std::string>>> parse_merges_txt(std::string_view text,
                                                                            const std::string& name);

}  // namespace gale
