// Megatron's NullTokenizer: the text is space-separated integer ids; eod = --vocab-size and the
// reported vocabulary is --vocab-size + 1. Also what `--mock-data` uses without tokenizer flags.
#pragma once

#include <memory>

#include "tokenizer/tokenizer.h"

namespace gale {

class NullTokenizer : public Tokenizer {
 public:
  static StatusOr<std::unique_ptr<NullTokenizer>> create(int64_t vocab_size);
  const std::string& type() const override { return type_; }
  int64_t vocab_size() const override { return vocab_size_ + 1; }
  int32_t eod() const override { return static_cast<int32_t>(vocab_size_); }
  Status encode(std::string_view text, std::vector<int32_t>* ids) const override;
  StatusOr<std::string> decode(std::span<const int32_t> ids) const override;

 private:
  std::string type_ = "NullTokenizer";
  int64_t vocab_size_ = 0;
};

}  // namespace gale
